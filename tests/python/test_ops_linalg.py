"""matmul and linear against torch.matmul / F.linear: dtypes, odd shapes,
1-d operands, batch broadcast, strided inputs and outputs, every CPU ISA
path the machine has, and bad input."""
import math

import pytest
import torch
import torch.nn.functional as F

import hubrt
from cpu_isa import isa, linear_isa  # noqa: F401 (fixtures)
from oracle import TOL, TORCH_DTYPE, assert_close, to_hr, to_torch

DTYPES = ["f32", "bf16", "f16"]


def rand(*shape, dtype="f32", seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(TORCH_DTYPE[dtype])


def check(got, want, k):
    """Tolerances grow with sqrt(K): f32-accumulated sums of K products."""
    atol, rtol = TOL[got.dtype]
    assert_close(got, want, atol=atol * math.sqrt(max(k, 1)), rtol=rtol)


def strided_hr(t, dim0=0, dim1=-1):
    """A hubrt view with t's values whose dims dim0, dim1 are swapped in memory."""
    return to_hr(t.transpose(dim0, dim1).contiguous()).transpose(dim0, dim1)


LINEAR_SHAPES = [(1, 17, 64), (1, 64, 4097), (1, 4097, 15), (3, 15, 17), (17, 3, 1), (15, 64, 3),
                 (64, 17, 15), (4097, 3, 17), (100, 129, 300),
                 # around the skinny bf16 route (5..96 rows, no packing of the
                 # weight) and its tile edges: 6 rows x 4 weight rows per
                 # tile, K in vectors of 32 and blocks of 1024
                 (5, 1, 1), (15, 17, 31), (17, 15, 33), (33, 31, 17), (65, 4, 1025), (96, 9, 64),
                 (97, 5, 40), (6, 3, 4097), (12, 4097, 33)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES)
def test_linear(linear_isa, dtype, m, n, k):
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, seed=1), rand(n, dtype=dtype, seed=2)
    check(hubrt.ops.linear(to_hr(x), to_hr(w), to_hr(b)), F.linear(x, w, b), k)
    check(hubrt.ops.linear(to_hr(x), to_hr(w)), F.linear(x, w), k)


# The skinny bf16 route's edges: every row count 5..17 and ones around its
# tiles of 6 x rows and its passes of up to 192 rows (63, 65, 97, 513),
# weight row counts around its blocks of 4 and chunks of 32 (1, 3, 5, 17,
# 37, 67), K around its vectors of 32 and K blocks of up to 2048 (33, 4097:
# three blocks, 8192: four, with fewer rows per pass).
SKINNY_SHAPES = [(5, 17, 32), (6, 5, 33), (7, 3, 4097), (8, 1, 32), (9, 17, 33), (10, 5, 8192), (11, 3, 32),
                 (12, 1, 4097), (13, 17, 8192), (14, 5, 32), (15, 3, 33), (16, 17, 4097), (17, 1, 33),
                 (63, 17, 33), (65, 5, 4097), (97, 3, 8192), (513, 17, 33), (65, 67, 4097), (200, 37, 8192),
                 (513, 70, 1024)]
# The panel route (256 rows or more of bf16 x in place): rows around its
# tiles of 6 and the threshold, weight rows around its panels of 64 (1, 63,
# 64, 65, 129), K odd (a lone last element) and across 16-pair transposes;
# under amx, rows around its blocks of 32 (262 = 8 x 32 + 6) and K below,
# at and past its tiles of 32 (17, 31, 33, 256, 1023, 2049).
PANEL_SHAPES = [(256, 1, 1), (257, 63, 17), (262, 64, 33), (263, 65, 31), (300, 129, 256), (512, 70, 1023),
                (1030, 17, 2049)]


@pytest.mark.parametrize("m,n,k", SKINNY_SHAPES + PANEL_SHAPES)
def test_linear_bf16_routes(linear_isa, m, n, k):
    x, w, b = rand(m, k, dtype="bf16"), rand(n, k, dtype="bf16", seed=1), rand(n, dtype="bf16", seed=2)
    check(hubrt.ops.linear(to_hr(x), to_hr(w), to_hr(b)), F.linear(x, w, b), k)
    # the weight a slice of a wider one (rows further apart than K), and x
    # rows a slice of wider rows whose next element is inf: an odd K's lone
    # last element must not pull it in (inf * 0 would be nan)
    wide = to_hr(torch.cat([w, rand(n, 5, dtype="bf16", seed=3)], dim=1)).narrow(1, 0, k)
    xinf = torch.cat([x, torch.full((m, 1), float("inf"), dtype=torch.bfloat16)], dim=1)
    got = hubrt.ops.linear(to_hr(xinf).narrow(1, 0, k), wide)
    assert torch.isfinite(to_torch(got)).all()
    check(got, F.linear(x, w), k)
    # batched rows, and the output into every other column of a larger buffer
    xb = x.reshape(2, m // 2, k) if m % 2 == 0 else x.reshape(1, m, k)
    base = to_hr(torch.zeros(*xb.shape[:2], 2 * n, dtype=torch.bfloat16))
    hubrt.ops.call("linear", to_hr(xb), to_hr(w), to_hr(b), out=base.slice(2, 0, None, 2))
    out = to_torch(base)
    assert torch.all(out[..., 1::2] == 0)
    check(to_hr(out[..., 0::2]), F.linear(xb, w, b), k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
@pytest.mark.parametrize("m", [1, 5])
def test_linear_batched_and_1d(isa, dtype, lead, m):
    k, n = 33, 40
    shape = lead + (m, k) if lead or m > 1 else (k,)
    x, w, b = rand(*shape, dtype=dtype), rand(n, k, dtype=dtype, seed=1), rand(n, dtype=dtype, seed=2)
    check(hubrt.ops.linear(to_hr(x), to_hr(w), to_hr(b)), F.linear(x, w, b), k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 40])
def test_linear_strided(isa, dtype, m):
    k, n = 70, 37
    x, w, b = rand(2, m, k, dtype=dtype), rand(n, k, dtype=dtype, seed=1), rand(n, dtype=dtype, seed=2)
    want = F.linear(x, w, b)
    # x with its feature dim strided, weight transposed in memory, bias a strided slice
    xs = strided_hr(x, 0, 2)
    ws = strided_hr(w, 0, 1)
    bs = to_hr(torch.stack([b, b], dim=1)).select(1, 0)
    assert not xs.is_contiguous() and not ws.is_contiguous() and not bs.is_contiguous()
    check(hubrt.ops.linear(xs, ws, bs), want, k)
    # rows that do not fold into one stride: a narrowed middle dim
    big = torch.cat([x, rand(2, 4, k, dtype=dtype, seed=3)], dim=1)
    check(hubrt.ops.linear(to_hr(big).narrow(1, 0, m), to_hr(w), to_hr(b)), want, k)
    # output written into every other column of a larger buffer
    base = to_hr(torch.zeros(2, m, 2 * n, dtype=TORCH_DTYPE[dtype]))
    hubrt.ops.call("linear", to_hr(x), to_hr(w), to_hr(b), out=base.slice(2, 0, None, 2))
    got = to_torch(base)
    assert torch.all(got[..., 1::2] == 0)
    check(to_hr(got[..., 0::2]), want, k)


# The decode route (a few rows against W [n, k]): odd n and k around the
# kernels' 32-element loads and 4/16-column blocks, and one n split between
# threads.
GEMV_SHAPES = [(1, 1), (15, 17), (17, 15), (31, 33), (33, 31), (4097, 33), (17, 4097), (67, 1024)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16])
@pytest.mark.parametrize("n,k", GEMV_SHAPES)
def test_linear_gemv_route(isa, dtype, rows, n, k):
    x, w, b = rand(rows, k, dtype=dtype), rand(n, k, dtype=dtype, seed=1), rand(n, dtype=dtype, seed=2)
    check(hubrt.ops.linear(to_hr(x), to_hr(w), to_hr(b)), F.linear(x, w, b), k)
    # x with its feature dim strided
    xs = to_hr(torch.stack([x, x], dim=-1)).select(-1, 0)
    assert k == 1 or not xs.is_contiguous()
    check(hubrt.ops.linear(xs, to_hr(w)), F.linear(x, w), k)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_linear_gemv_columns_independent(isa, rows):
    """A column's bits do not depend on n or on where the threads and kernel
    blocks cut the columns (fused linears rely on it)."""
    x, w = rand(rows, 1024, dtype="bf16"), rand(4097, 1024, dtype="bf16", seed=1)
    full = to_torch(hubrt.ops.linear(to_hr(x), to_hr(w)))
    for a, z in [(0, 1), (3, 20), (17, 50), (4000, 4097)]:
        part = to_torch(hubrt.ops.linear(to_hr(x), to_hr(w[a:z])))
        assert torch.equal(part, full[:, a:z])


MATMUL_SHAPES = [
    ((17,), (17,)),
    ((64,), (64, 15)),
    ((3, 17), (17,)),
    ((2, 5, 17), (17,)),
    ((17,), (2, 17, 3)),
    ((1, 1), (1, 1)),
    ((15, 64), (64, 17)),
    ((4097, 3), (3, 15)),
    ((3, 4097), (4097, 17)),
    ((1, 17), (17, 4097)),
    ((2, 1, 3, 15), (3, 15, 17)),
    ((4, 17, 64), (1, 64, 3)),
    ((5, 1, 64), (5, 64, 33)),
    ((2, 3, 0, 4), (4, 5)),
    ((3, 0), (0, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(isa, dtype, sa, sb):
    a, b = rand(*sa, dtype=dtype), rand(*sb, dtype=dtype, seed=1)
    check(hubrt.ops.matmul(to_hr(a), to_hr(b)), torch.matmul(a, b), sa[-1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_strided(isa, dtype):
    a, b = rand(3, 20, 33, dtype=dtype), rand(3, 33, 18, dtype=dtype, seed=1)
    want = torch.matmul(a, b)
    check(hubrt.ops.matmul(strided_hr(a, 1, 2), strided_hr(b, 1, 2)), want, 33)
    check(hubrt.ops.matmul(strided_hr(a, 0, 2), strided_hr(b, 0, 1)), want, 33)
    # b = k^T style view: K contiguous; broadcast batch via an expand
    kt = to_hr(b.transpose(1, 2).contiguous()).transpose(1, 2)
    check(hubrt.ops.matmul(to_hr(a[:1]).expand(3, 20, 33), kt), torch.matmul(a[:1].expand(3, 20, 33), b), 33)


def test_matmul_decode_gemv(isa):
    """1 row against a K-contiguous B: the GEMV route, batched and not."""
    for dtype in DTYPES:
        x, w = rand(1, 4097, dtype=dtype), rand(4097, 65, dtype=dtype, seed=1)
        wt = to_hr(w.t().contiguous()).transpose(0, 1)
        check(hubrt.ops.matmul(to_hr(x), wt), x @ w, 4097)
        check(hubrt.ops.matmul(to_hr(x[0]), wt), x[0] @ w, 4097)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_skinny_views(isa, dtype):
    """Skinny row counts through views: rows gathered across broadcast
    batches, a K-strided x, a transposed K-contiguous B, a strided output."""
    k, n = 70, 37
    a, b = rand(3, 7, k, dtype=dtype), rand(k, n, dtype=dtype, seed=1)
    bt = to_hr(b.t().contiguous()).transpose(0, 1)
    want = torch.matmul(a, b)
    check(hubrt.ops.matmul(to_hr(a), bt), want, k)
    check(hubrt.ops.matmul(strided_hr(a, 1, 2), bt), want, k)
    check(hubrt.ops.matmul(to_hr(a[:1]).expand(3, 7, k), bt), torch.matmul(a[:1].expand(3, 7, k), b), k)
    base = to_hr(torch.zeros(3, 7, 2 * n, dtype=TORCH_DTYPE[dtype]))
    hubrt.ops.call("matmul", to_hr(a), bt, out=base.slice(2, 1, None, 2))
    got = to_torch(base)
    assert torch.all(got[..., 0::2] == 0)
    check(to_hr(got[..., 1::2]), want, k)
    # a B with a batch of its own is not shared: the tiled route
    bb = rand(3, n, k, dtype=dtype, seed=2)
    check(hubrt.ops.matmul(to_hr(a), to_hr(bb).transpose(1, 2)), torch.matmul(a, bb.transpose(1, 2)), k)


def test_linear_errors():
    x, w = to_hr(rand(2, 8)), to_hr(rand(4, 8))
    with pytest.raises(hubrt.HubrtError, match=r"linear.*weight"):
        hubrt.ops.linear(x, to_hr(rand(4, 9)))
    with pytest.raises(hubrt.HubrtError, match=r"linear.*weight.*2-d"):
        hubrt.ops.linear(x, to_hr(rand(8)))
    with pytest.raises(hubrt.HubrtError, match=r"linear.*bias"):
        hubrt.ops.linear(x, w, to_hr(rand(5)))
    with pytest.raises(hubrt.HubrtError, match=r"linear.*weight.*bf16"):
        hubrt.ops.linear(x, to_hr(rand(4, 8, dtype="bf16")))
    with pytest.raises(hubrt.HubrtError, match=r"linear.*x.*i64"):
        hubrt.ops.linear(to_hr(torch.ones(2, 8, dtype=torch.int64)), w)


def test_matmul_errors():
    with pytest.raises(hubrt.HubrtError, match=r"matmul.*contraction"):
        hubrt.ops.matmul(to_hr(rand(2, 3)), to_hr(rand(4, 5)))
    with pytest.raises(hubrt.HubrtError, match=r"matmul.*batch.*broadcast"):
        hubrt.ops.matmul(to_hr(rand(2, 3, 4)), to_hr(rand(3, 4, 5)))
    with pytest.raises(hubrt.HubrtError, match=r"matmul.*at least 1 dim"):
        hubrt.ops.matmul(to_hr(rand(1)).squeeze(0), to_hr(rand(3)))
    with pytest.raises(hubrt.HubrtError, match=r"matmul.*f16"):
        hubrt.ops.matmul(to_hr(rand(2, 3)), to_hr(rand(3, 2, dtype="f16")))
    with pytest.raises(hubrt.HubrtError, match=r"matmul.*output"):
        hubrt.ops.call("matmul", to_hr(rand(2, 3)), to_hr(rand(3, 2)), out=to_hr(rand(2, 3)))
