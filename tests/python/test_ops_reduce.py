"""Reduce ops against torch: sum, mean, max, min, argmax, softmax,
log_softmax, cumsum, topk over f32/bf16/f16 and integers, odd shapes, every
dim (negative too), keepdim both ways, non-contiguous inputs and outputs."""
import math

import numpy as np
import pytest
import torch

import hubrt
from oracle import TOL, TORCH_DTYPE, assert_close, to_hr, to_torch

FLOATS = ["f32", "bf16", "f16"]
SHAPES = [(1,), (3,), (17,), (4097,), (3, 17), (2, 3, 17), (4097, 3)]


def rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(TORCH_DTYPE[dtype])


def strided(t):
    """(torch view, hubrt view) with t's values and transposed / stepped
    strides, so the kernels see non-contiguous inputs."""
    if t.dim() == 1:
        base = torch.stack([t, t], dim=-1)
        return base[..., 0], to_hr(base).select(-1, 0)
    base = t.transpose(0, -1).contiguous()
    return base.transpose(0, -1), to_hr(base).transpose(0, -1)


def hr_out(shape, dtype):
    """A hubrt destination view with every other element of a wider buffer."""
    wide = list(shape[:-1]) + [2 * shape[-1]] if shape else [2]
    np_dt = np.float32 if dtype in FLOATS else np.int64
    base = hubrt.from_numpy(np.zeros(wide, dtype=np_dt), dtype=dtype)
    view = base.slice(-1, 0, None, 2)
    return view if shape else view.select(0, 0)


def sum_atol(dtype, n):
    """Sums of n standard normals: the reference rounds differently, so the
    absolute tolerance grows with the summands' spread (sqrt(n))."""
    return TOL[dtype][0] * max(1.0, math.sqrt(n))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reduce_float(op, dtype, shape):
    x = rand(shape, dtype)
    for dim in range(-len(shape), len(shape)):
        for keepdim in (False, True):
            got = getattr(hubrt.ops, op)(to_hr(x), dim, keepdim)
            want = getattr(torch, op)(x.float(), dim, keepdim=keepdim)
            if op in ("max", "min"):
                want = want.values
            if op == "argmax":
                want = torch.argmax(x, dim, keepdim=keepdim)  # ties decided in x's own dtype
            atol = sum_atol(dtype, shape[dim]) if op == "sum" else None
            assert_close(got, want.to(x.dtype) if op != "argmax" else want, atol=atol)


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "mean"])
def test_reduce_noncontig_in_out(op):
    x = rand((17, 5, 3), "f32")
    xt, xh = strided(x)
    for dim, keepdim in [(0, False), (1, True), (-1, False)]:
        want = getattr(torch, op)(xt, dim, keepdim=keepdim)
        want = want.values if op == "max" else want
        out = hr_out(tuple(want.shape), "i64" if op == "argmax" else "f32")
        hubrt.ops.call(op, xh, out=out, dim=dim, keepdim=keepdim)
        assert not out.is_contiguous()
        assert_close(out, want, atol=sum_atol("f32", x.shape[dim]))


@pytest.mark.parametrize("dtype", ["i64", "i32", "u8", "bool"])
def test_reduce_integers(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (5, 17, 3), generator=g).to(TORCH_DTYPE[dtype])
    for dim in (0, 1, -1):
        assert_close(hubrt.ops.sum(to_hr(x), dim), torch.sum(x, dim))  # ints and bool sum to i64
        assert hubrt.ops.sum(to_hr(x), dim).dtype == "i64"
        assert_close(hubrt.ops.argmax(to_hr(x), dim, True), torch.argmax(x.long(), dim, keepdim=True))
        if dtype != "bool":
            assert_close(hubrt.ops.max(to_hr(x), dim), torch.amax(x, dim))
            assert_close(hubrt.ops.min(to_hr(x), dim), torch.amin(x, dim))
        assert_close(hubrt.ops.cumsum(to_hr(x), dim), torch.cumsum(x, dim))


def test_reduce_i64_exact_and_wrapping():
    x = torch.tensor([2**62, 2**62, 2**62, 7], dtype=torch.int64)
    assert_close(hubrt.ops.sum(to_hr(x), 0), torch.sum(x, 0))  # wraps like torch
    big = torch.tensor([2**53 + 1, 2**53], dtype=torch.int64)
    assert hubrt.ops.argmax(to_hr(big), 0).item() == 0


def test_reduce_f64():
    x = torch.randn(4097, dtype=torch.float64)
    assert_close(hubrt.ops.sum(to_hr(x), 0), torch.sum(x, 0), atol=1e-12, rtol=1e-12)
    assert_close(hubrt.ops.max(to_hr(x), 0), torch.amax(x, 0), atol=0, rtol=0)


def test_argmax_ties_and_nan():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    assert_close(hubrt.ops.argmax(to_hr(x), 1), torch.argmax(x, 1))
    assert_close(hubrt.ops.argmax(to_hr(x), 0), torch.argmax(x, 0))
    big = torch.zeros(4097)
    big[[100, 3000]] = 5.0
    assert hubrt.ops.argmax(to_hr(big), 0).item() == 100
    nan = torch.tensor([[1.0, float("nan"), 5.0, float("nan")], [0.0, 1.0, 2.0, 3.0]])
    assert_close(hubrt.ops.argmax(to_hr(nan), 1), torch.argmax(nan, 1))
    assert_close(hubrt.ops.max(to_hr(nan), 1), torch.amax(nan, 1))
    assert_close(hubrt.ops.min(to_hr(nan), 1), torch.amin(nan, 1))
    # column mode (reduced dim not innermost) propagates NaN too
    assert_close(hubrt.ops.max(to_hr(nan.t().contiguous()), 0), torch.amax(nan, 1))
    assert_close(hubrt.ops.argmax(to_hr(nan.t().contiguous()), 0), torch.argmax(nan, 1))


def test_sum_mean_empty_dim():
    x = torch.zeros(3, 0)
    assert_close(hubrt.ops.sum(to_hr(x), 1), torch.sum(x, 1))
    assert_close(hubrt.ops.mean(to_hr(x), 1), torch.mean(x, 1))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1,), (17,), (4097,), (3, 17), (2, 3, 17), (4097, 3)])
def test_softmax(op, dtype, shape):
    x = rand(shape, dtype) * 4
    for dim in range(-len(shape), len(shape)):
        got = getattr(hubrt.ops, op)(to_hr(x), dim)
        want = getattr(torch, op)(x.float(), dim).to(x.dtype)
        atol = 2 * TOL[dtype][0] if op == "log_softmax" else None  # |log p| reaches ~20
        assert_close(got, want, atol=atol)


def test_softmax_stable_masked_and_strided():
    x = torch.tensor([[1000.0, 1001.0, -float("inf"), 999.0], [-1e4, 0.0, 1e4, -float("inf")]])
    assert_close(hubrt.ops.softmax(to_hr(x), -1), torch.softmax(x, -1))
    assert_close(hubrt.ops.log_softmax(to_hr(x), -1), torch.log_softmax(x, -1))
    allmasked = torch.full((2, 3), -float("inf"))
    assert_close(hubrt.ops.softmax(to_hr(allmasked), -1), torch.softmax(allmasked, -1))  # NaN, as torch
    y = rand((5, 33, 7), "f32")
    yt, yh = strided(y)
    for dim in (0, 1, 2):
        out = hr_out(tuple(y.shape), "f32")
        hubrt.ops.call("softmax", yh, out=out, dim=dim)
        assert_close(out, torch.softmax(yt, dim))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1,), (17,), (4097,), (3, 17), (4097, 3)])
def test_cumsum(dtype, shape):
    x = rand(shape, dtype)
    for dim in range(-len(shape), len(shape)):
        got = hubrt.ops.cumsum(to_hr(x), dim)
        # torch accumulates f32 in double and bf16/f16 in f32 on the CPU, as hubrt does
        assert_close(got, torch.cumsum(x, dim), atol=sum_atol(dtype, shape[dim]))


def test_cumsum_strided():
    x = rand((9, 4097), "f32")
    xt, xh = strided(x)
    for dim in (0, 1):
        out = hr_out(tuple(x.shape), "f32")
        hubrt.ops.call("cumsum", xh, out=out, dim=dim)
        assert_close(out, torch.cumsum(xt, dim), atol=1e-4)


@pytest.mark.parametrize("dtype", FLOATS + ["i64", "i32"])
@pytest.mark.parametrize("n,k", [(1, 1), (17, 3), (17, 17), (200, 3), (200, 4), (4097, 7), (4097, 100)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_ties_match_torch(dtype, n, k, largest):
    """Few distinct values, so most of the top k tie: torch's order comes
    from libstdc++'s partial_sort / nth_element + sort, which hubrt ports."""
    g = torch.Generator().manual_seed(n * 7 + k)
    x = torch.randint(-2, 3, (3, n), generator=g).to(TORCH_DTYPE[dtype])
    vals, idx = hubrt.ops.topk(to_hr(x), k, -1, largest)
    want_v, want_i = torch.topk(x, k, -1, largest=largest)
    assert vals.dtype == dtype and idx.dtype == "i64"
    assert torch.equal(to_torch(idx), want_i)
    assert torch.equal(to_torch(vals), want_v)


def test_topk_dims_strides_nan():
    x = rand((17, 4097), "f32")
    xt, xh = strided(x)
    for dim, k in [(0, 5), (1, 9), (-1, 64)]:
        want_v, want_i = torch.topk(xt, k, dim)
        vshape = tuple(want_v.shape)
        vo, io = hr_out(vshape, "f32"), hr_out(vshape, "i64")
        hubrt.ops.call("topk", xh, out=(vo, io), k=k, dim=dim, largest=True, sorted=True)
        assert torch.equal(to_torch(io), want_i)
        assert torch.equal(to_torch(vo), want_v)
    nan = torch.tensor([3.0, float("nan"), -0.0, 0.0, 7.0, float("nan"), -float("inf")])
    for largest in (True, False):
        v, i = hubrt.ops.topk(to_hr(nan), 4, 0, largest)
        wv, wi = torch.topk(nan, 4, 0, largest=largest)
        assert torch.equal(to_torch(i), wi)
        assert_close(v, wv, atol=0, rtol=0)


def test_zero_dim_input():
    x = torch.tensor(3.5)
    for op in ("sum", "amax", "argmax"):
        got = getattr(hubrt.ops, op.replace("amax", "max"))(to_hr(x), -1, True)
        assert_close(got, getattr(torch, op)(x, -1, keepdim=True))
    assert_close(hubrt.ops.softmax(to_hr(x), 0), torch.softmax(x, 0))
    assert_close(hubrt.ops.cumsum(to_hr(x), 0), torch.cumsum(x, 0))
    for k in (0, 1):
        v, i = hubrt.ops.topk(to_hr(x), k, 0)
        wv, wi = torch.topk(x, k, 0)
        assert_close(v, wv)
        assert_close(i, wi)


def test_reduce_errors_name_op_and_input():
    x = to_hr(torch.zeros(2, 3))
    with pytest.raises(hubrt.HubrtError, match=r"op 'sum'.*dim 2 out of range"):
        hubrt.ops.sum(x, 2)
    with pytest.raises(hubrt.HubrtError, match=r"op 'mean'.*x must be f32, bf16 or f16, got i64"):
        hubrt.ops.mean(to_hr(torch.zeros(3, dtype=torch.int64)), 0)
    with pytest.raises(hubrt.HubrtError, match=r"op 'softmax'.*x must be"):
        hubrt.ops.softmax(to_hr(torch.zeros(3, dtype=torch.int32)), 0)
    with pytest.raises(hubrt.HubrtError, match=r"op 'topk'.*k=4 is out of range.*size 3"):
        hubrt.ops.topk(x, 4, 1)
    with pytest.raises(hubrt.HubrtError, match=r"op 'max'.*empty along dim 1"):
        hubrt.ops.max(to_hr(torch.zeros(2, 0)), 1)
    with pytest.raises(hubrt.HubrtError, match=r"op 'argmax': output 0 is \[2\] f32 but the result is \[2\] i64"):
        hubrt.ops.call("argmax", x, out=hubrt.from_numpy(np.zeros(2, np.float32)), dim=1)
