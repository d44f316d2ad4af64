"""Helpers for oracle tests against torch: conversions and tolerances."""
import numpy as np
import torch

import hubrt

# Per-dtype tolerances (atol, rtol) for results stored in that dtype and
# computed in f32: bf16 has 8 mantissa bits, f16 has 11.
TOL = {"f32": (1e-5, 1e-5), "bf16": (1e-2, 1.6e-2), "f16": (1e-3, 2e-3)}
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
               "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8, "bool": torch.bool,
               "f64": torch.float64, "i8": torch.int8, "i16": torch.int16}
HR_DTYPE = {v: k for k, v in TORCH_DTYPE.items()}


def to_hr(t):
    """A hubrt copy of torch tensor t (any dtype, any strides)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return hubrt.from_numpy(t.view(torch.int16).numpy().view(np.uint16), dtype="bf16")
    return hubrt.from_numpy(t.numpy())


def to_torch(x):
    """A torch copy of hubrt tensor x, in x's dtype."""
    if x.dtype == "bf16":
        return torch.from_numpy(x.numpy(raw=True).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x.numpy())


def noncontig(t, dim=0):
    """The same values as t through a non-contiguous view (transposed copy)."""
    if t.dim() < 2:
        big = torch.stack([t, t], dim=-1)
        return big[..., 0]
    return t.transpose(dim, -1).contiguous().transpose(dim, -1)


def hr_noncontig(x, dim=0):
    """A non-contiguous hubrt view with x's values (the strides differ)."""
    if x.ndim == 0:
        return x
    if x.ndim == 1:
        # every other element of a doubled copy: stride 2
        doubled = hubrt.ops.contiguous(x.unsqueeze(1).expand(x.shape[0], 2))
        return doubled.select(1, 0)
    return hubrt.ops.contiguous(x.transpose(dim, -1)).transpose(dim, -1)


def assert_close(got, want, dtype=None, atol=None, rtol=None):
    """Compares a hubrt result with a torch reference in f32/f64."""
    dtype = dtype or got.dtype
    a, r = TOL.get(dtype, (0, 0))
    atol = a if atol is None else atol
    rtol = r if rtol is None else rtol
    g = to_torch(got)
    assert tuple(g.shape) == tuple(want.shape), f"shape {tuple(g.shape)} != {tuple(want.shape)}"
    if g.dtype.is_floating_point or want.dtype.is_floating_point:
        torch.testing.assert_close(g.double(), want.double(), atol=atol, rtol=rtol, equal_nan=True)
    else:
        assert torch.equal(g.long(), want.long())
