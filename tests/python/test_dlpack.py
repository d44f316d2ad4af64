"""DLPack between hubrt and torch: every dtype, zero-copy both ways, strided
views, lifetimes (each side outlives the other), and clear errors."""
import gc

import numpy as np
import pytest
import torch

import hubrt
from hubrt import dlpack
from oracle import TORCH_DTYPE, to_hr, to_torch

DTYPES = list(TORCH_DTYPE)


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def sample(dtype, shape):
    td = TORCH_DTYPE[dtype]
    g = torch.Generator().manual_seed(7)
    if td == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if td.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(td)
    return torch.randint(-100 if td != torch.uint8 else 0, 100, shape, generator=g, dtype=td)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (3, 17), (2, 0, 3), (4097,)])
def test_hubrt_to_torch_every_dtype(dtype, shape):
    ref = sample(dtype, shape)
    # a hubrt-owned copy (from_numpy turns 0-dim arrays into shape (1,))
    h = hubrt.ops.copy(hubrt.from_dlpack(ref)) if shape == () else to_hr(ref)
    t = torch.from_dlpack(h)
    assert t.dtype == TORCH_DTYPE[dtype] and tuple(t.shape) == shape
    assert torch.equal(bits(t), bits(ref))
    if ref.numel():
        t.reshape(-1)[0] = t.reshape(-1)[-1]  # shares hubrt's memory
        assert torch.equal(bits(to_torch(h)), bits(t))


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_to_hubrt_every_dtype(dtype):
    ref = sample(dtype, (5, 7))
    h = hubrt.from_dlpack(ref)
    assert h.dtype == dtype and h.shape == (5, 7)
    assert torch.equal(bits(to_torch(h)), bits(ref))
    assert torch.from_dlpack(h).data_ptr() == ref.data_ptr()  # zero-copy round trip


def test_strided_views_both_ways():
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    for view in (base.transpose(0, 2), base[:, 1::2, ::3], base[1].t(), base[:, :1].expand(4, 3, 5)):
        h = hubrt.from_dlpack(view)
        assert h.strides == view.stride()
        assert torch.equal(to_torch(h), view)
        back = torch.from_dlpack(h)
        assert back.stride() == view.stride() and back.data_ptr() == view.data_ptr()
    h = to_hr(base).permute(2, 0, 1).slice(1, 1, 4)
    t = torch.from_dlpack(h)
    assert t.stride() == h.strides
    assert torch.equal(t, base.permute(2, 0, 1)[:, 1:4])


def test_bf16_views_keep_their_bits():
    ref = sample("bf16", (9, 4))
    h = to_hr(ref).transpose(0, 1)
    t = torch.from_dlpack(h)
    assert t.dtype == torch.bfloat16
    assert torch.equal(bits(t), bits(ref.t()))


def test_torch_tensor_outlives_hubrt():
    base = len(dlpack._exported)
    h = to_hr(sample("f32", (64,)))
    want = to_torch(h)
    t = torch.from_dlpack(h)
    del h
    gc.collect()
    assert torch.equal(t, want)  # the export keeps the hubrt buffer alive
    assert len(dlpack._exported) == base + 1
    del t
    gc.collect()
    assert len(dlpack._exported) == base  # torch ran the deleter


def test_hubrt_outlives_torch():
    src = torch.arange(100, dtype=torch.int64)
    h = hubrt.from_dlpack(src[10:20])
    del src
    gc.collect()
    assert h.tolist() == list(range(10, 20))


def test_unconsumed_capsule_releases_its_tensor():
    base = len(dlpack._exported)
    cap = to_hr(sample("i32", (3,))).__dlpack__()
    assert len(dlpack._exported) == base + 1
    del cap
    gc.collect()
    assert len(dlpack._exported) == base


def test_copy_request_copies():
    h = to_hr(sample("f16", (4, 4)))
    t = torch.from_dlpack(h, copy=True)
    assert t.data_ptr() != torch.from_dlpack(h).data_ptr()
    assert torch.equal(t, to_torch(h))


def test_errors():
    with pytest.raises(hubrt.HubrtError, match="unsupported DLPack dtype code 5 bits 64"):
        hubrt.from_dlpack(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(hubrt.HubrtError, match="negative strides"):
        hubrt.from_dlpack(np.arange(6)[::-2])
    cap = torch.zeros(2).__dlpack__()
    hubrt.from_dlpack(cap)
    with pytest.raises(hubrt.HubrtError, match="unconsumed 'dltensor' capsule"):
        hubrt.from_dlpack(cap)
    with pytest.raises(BufferError, match="cannot export to device"):
        to_hr(torch.zeros(2)).__dlpack__(dl_device=(2, 0))
