"""Image ops against torch: conv2d (F.conv2d: kernel sizes, stride,
padding, dilation, groups, bias, strided inputs and outputs, large images
that take several gathered tiles), group_norm (F.group_norm, with and
without affine, 3-d and 4-d) and upsample_nearest (F.interpolate nearest),
over f32/bf16 and every kernel ISA; the errors of bad shapes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from oracle import TORCH_DTYPE, to_hr, to_torch


def rand(shape, dtype="f32", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(TORCH_DTYPE[dtype])


def rel_err(got, want):
    g, w = to_torch(got).double(), want.double()
    assert tuple(g.shape) == tuple(w.shape), f"shape {tuple(g.shape)} != {tuple(w.shape)}"
    return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()


CONVS = [  # (n, c, h, w, o, k, stride, padding, dilation, groups)
    (1, 3, 8, 8, 4, 3, 1, 1, 1, 1),
    (2, 5, 9, 7, 6, 3, 2, 1, 1, 1),
    (1, 4, 6, 6, 4, 1, 1, 0, 1, 1),  # 1x1: x read in place
    (2, 8, 5, 5, 6, 3, 1, 2, 2, 2),  # dilation, groups
    (1, 6, 7, 9, 3, (2, 3), (1, 2), (0, 1), 1, 3),
    (1, 16, 4, 4, 8, 2, 2, 0, 1, 1),  # the patch embedding's shape: kernel = stride
]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", CONVS)
def test_conv2d_matches_torch(isa, dtype, case):
    n, c, h, w, o, k, stride, padding, dilation, groups = case
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rand((n, c, h, w), dtype)
    wt = rand((o, c // groups, kh, kw), dtype, seed=1, scale=0.3)
    b = rand((o,), dtype, seed=2)
    want = F.conv2d(x.float(), wt.float(), b.float(), stride, padding, dilation, groups)
    got = hubrt.ops.conv2d(to_hr(x), to_hr(wt), to_hr(b), stride, padding, dilation, groups)
    assert got.dtype == dtype
    # f32: the sums' order; bf16: one rounding of the f32 result
    assert rel_err(got, want) <= (2e-6 if dtype == "f32" else 8e-3)
    nobias = hubrt.ops.conv2d(to_hr(x), to_hr(wt), None, stride, padding, dilation, groups)
    assert rel_err(nobias, F.conv2d(x.float(), wt.float(), None, stride, padding, dilation, groups)) <= (
        2e-6 if dtype == "f32" else 8e-3)


def test_conv2d_large_image_takes_several_tiles():
    """A 3x3 convolution over 128 channels of 96x96 gathers more windows than
    one tile holds (4 MB): the tiles must meet exactly."""
    x, wt, b = rand((1, 128, 96, 96)), rand((64, 128, 3, 3), seed=1, scale=0.05), rand((64,), seed=2)
    got = hubrt.ops.conv2d(to_hr(x), to_hr(wt), to_hr(b), 1, 1)
    assert rel_err(got, F.conv2d(x, wt, b, 1, 1)) <= 2e-6


def test_conv2d_strided_input_and_output():
    x = rand((2, 6, 8, 8))
    wt, b = rand((4, 6, 3, 3), seed=1), rand((4,), seed=2)
    xt = to_hr(x.permute(0, 2, 3, 1).contiguous()).permute([0, 3, 1, 2])  # NHWC memory, NCHW view
    wtt = to_hr(wt.permute(0, 2, 3, 1).contiguous()).permute([0, 3, 1, 2])  # weight not dense per channel
    out = hubrt.from_numpy(np.zeros((2, 8, 8, 4), np.float32)).permute([0, 3, 1, 2])
    hubrt.ops.call("conv2d", xt, wtt, to_hr(b), out=out, stride_h=1, stride_w=1, pad_h=1, pad_w=1,
                   dilation_h=1, dilation_w=1, groups=1)
    assert rel_err(out, F.conv2d(x, wt, b, 1, 1)) <= 2e-6


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,groups", [((2, 32, 5, 7), 8), ((1, 6, 11), 3), ((3, 4, 2, 2), 1), ((1, 64, 33, 17), 32)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(isa, dtype, shape, groups, affine):
    x = rand(shape, dtype, scale=3.0) + 1.5
    w = rand((shape[1],), dtype, seed=1) if affine else None
    b = rand((shape[1],), dtype, seed=2) if affine else None
    want = F.group_norm(x.float(), groups, None if w is None else w.float(), None if b is None else b.float(), 1e-6)
    got = hubrt.ops.group_norm(to_hr(x), groups, None if w is None else to_hr(w), None if b is None else to_hr(b),
                               eps=1e-6)
    assert got.dtype == dtype
    assert rel_err(got, want) <= (2e-6 if dtype == "f32" else 8e-3)


def test_group_norm_strided_input():
    x = rand((2, 8, 6, 6))
    xt = to_hr(x.transpose(2, 3).contiguous()).transpose(2, 3)
    got = hubrt.ops.group_norm(xt, 4, eps=1e-5)
    assert rel_err(got, F.group_norm(x, 4, eps=1e-5)) <= 2e-6


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("scale", [1, 2, 3])
def test_upsample_nearest_matches_interpolate(dtype, scale):
    x = rand((2, 3, 5, 4), dtype)
    got = hubrt.ops.upsample_nearest(to_hr(x), scale)
    want = F.interpolate(x, scale_factor=float(scale), mode="nearest")
    assert torch.equal(to_torch(got), want)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_upsample_nearest_strided_input_and_output(dtype):
    x = rand((2, 3, 5, 4), dtype)
    xt = to_hr(x.transpose(2, 3).contiguous()).transpose(2, 3)
    out = hubrt.from_numpy(np.zeros((2, 3, 8, 10), np.float32), dtype=dtype).transpose(2, 3)
    hubrt.ops.call("upsample_nearest", xt, out=out, scale=2)
    assert torch.equal(to_torch(hubrt.ops.contiguous(out)), F.interpolate(x, scale_factor=2.0, mode="nearest"))


@pytest.mark.parametrize("call,message", [
    (lambda: hubrt.ops.conv2d(to_hr(rand((1, 4, 5, 5))), to_hr(rand((2, 3, 3, 3)))), "does not fit x"),
    (lambda: hubrt.ops.conv2d(to_hr(rand((1, 4, 2, 2))), to_hr(rand((2, 4, 3, 3)))), "does not fit the padded"),
    (lambda: hubrt.ops.conv2d(to_hr(rand((4, 5, 5))), to_hr(rand((2, 4, 3, 3)))), "must be [n, c, h, w]"),
    (lambda: hubrt.ops.conv2d(to_hr(rand((1, 4, 5, 5))), to_hr(rand((2, 4, 3, 3))), to_hr(rand((3,)))),
     "the output channels"),
    (lambda: hubrt.ops.conv2d(to_hr(rand((1, 4, 5, 5))), to_hr(rand((2, 4, 3, 3))), stride=0), "must be >= 1"),
    (lambda: hubrt.ops.conv2d(to_hr(rand((1, 4, 5, 5))), to_hr(rand((2, 4, 3, 3), "bf16"))), "weight bf16 must have x's dtype f32"),
    (lambda: hubrt.ops.group_norm(to_hr(rand((1, 6, 4))), 4), "divide the 6 channels"),
    (lambda: hubrt.ops.group_norm(to_hr(rand((1, 6, 4))), 3, to_hr(rand((5,)))), "the channels of x"),
    (lambda: hubrt.ops.upsample_nearest(to_hr(rand((6, 4))), 2), "must be [n, c, h, w]"),
    (lambda: hubrt.ops.upsample_nearest(to_hr(rand((1, 1, 6, 4))), 0), "scale 0"),
])
def test_image_op_errors_name_the_problem(call, message):
    with pytest.raises(hubrt.HubrtError, match=None) as e:
        call()
    assert message in str(e.value)
