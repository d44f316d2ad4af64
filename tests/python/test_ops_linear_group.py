"""linear_group: n linears on the same rows x (q/k/v; gate/up) with a
store, silu_mul, gelu_tanh_mul or residual epilogue. Against torch (each
product rounded to x's dtype first, as linear stores it); bit for bit
against the separate ops (linear, then silu_mul / gelu_mul(tanh) / add) on
the CPU kernel's fused decode path and on its unfused one (HUBRT_FUSE=0),
under every CPU ISA; weights packed into panels; the residual updated in
place; the xla_cpu device; bad input."""
import ctypes
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hubrt
from cpu_isa import ISA, linear_isa, lib, use_isa  # noqa: F401 (fixture)
from hubrt._lib import HubrtError, check as hr_check, fn
from oracle import TOL, TORCH_DTYPE, assert_close, to_hr, to_torch

DTYPES = ["f32", "bf16", "f16"]
# (epilogue, n): every count store takes, and the counts the others need
SPECS = [("store", 1), ("store", 2), ("store", 3), ("silu_mul", 2), ("gelu_tanh_mul", 2), ("residual", 1)]
SPEC_IDS = [f"{e}{n}" for e, n in SPECS]
ISA_NAME = {v: k for k, v in ISA.items()}


def rand(*shape, dtype="f32", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return (torch.randn(*shape, generator=g) * scale).to(TORCH_DTYPE[dtype])


def raw(t):
    return t.numpy(raw=True).tobytes()


def as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


def feature_sizes(epi, n, sizes):
    """n_j per linear: gate and up share one size; store takes the first n."""
    return [sizes[0]] * n if epi in ("silu_mul", "gelu_tanh_mul") else list(sizes[:n])


def make_case(dtype, epi, n, lead, k, sizes, bias, seed=0, scale=1.0):
    """torch inputs: x [*lead, k], the weights, the biases (or None) and the
    residual (or None). `scale` multiplies the weights (1/sqrt(k) keeps the
    products near 1, where the gated epilogues' tolerances are meaningful)."""
    nj = feature_sizes(epi, n, sizes)
    x = rand(*lead, k, dtype=dtype, seed=seed)
    ws = [rand(m, k, dtype=dtype, seed=seed + 10 + j, scale=scale) for j, m in enumerate(nj)]
    bs = [rand(m, dtype=dtype, seed=seed + 20 + j) for j, m in enumerate(nj)] if bias else None
    res = rand(*lead, nj[0], dtype=dtype, seed=seed + 30) if epi == "residual" else None
    return x, ws, bs, res


def torch_ref(x, ws, bs, epi, res):
    """The products in f32, each rounded to x's dtype, then the epilogue in
    f32 rounded once more."""
    dt = x.dtype
    ys = [F.linear(x.float(), w.float(), None if bs is None else bs[j].float()).to(dt) for j, w in enumerate(ws)]
    if epi == "store":
        return ys
    if epi == "silu_mul":
        return [(F.silu(ys[0].float()) * ys[1].float()).to(dt)]
    if epi == "gelu_tanh_mul":
        return [(F.gelu(ys[0].float(), approximate="tanh") * ys[1].float()).to(dt)]
    return [(ys[0].float() + res.float()).to(dt)]


def separate(x, ws, bs, epi, res):
    """The same through the separate hubrt ops (hubrt tensors)."""
    ys = [hubrt.ops.linear(x, w, None if bs is None else bs[j]) for j, w in enumerate(ws)]
    if epi == "store":
        return ys
    if epi == "silu_mul":
        return [hubrt.ops.silu_mul(ys[0], ys[1])]
    if epi == "gelu_tanh_mul":
        return [hubrt.ops.gelu_mul(ys[0], ys[1], approximate="tanh")]
    return [hubrt.ops.add(ys[0], res)]


def group(x, ws, bs, epi, res, out=None):
    return as_tuple(hubrt.ops.linear_group(x, ws, bs, epilogue=epi, residual=res, out=out))


def hr_all(x, ws, bs, res):
    return (to_hr(x), [to_hr(w) for w in ws], None if bs is None else [to_hr(b) for b in bs],
            None if res is None else to_hr(res))


def check(got, want, k):
    """Tolerances grow with sqrt(K): f32-accumulated sums of K products."""
    atol, rtol = TOL[got.dtype]
    assert_close(got, want, atol=atol * math.sqrt(max(k, 1)), rtol=rtol)


def set_fuse(monkeypatch, fuse):
    if fuse is None:
        monkeypatch.delenv("HUBRT_FUSE", raising=False)
    else:
        monkeypatch.setenv("HUBRT_FUSE", fuse)


# ---- against torch -----------------------------------------------------------

# (leading dims of x, k, feature sizes n_j): decode rows (1, 3, 4, 5, 16:
# the fused kernel's range) and prefill rows (17, 64), 3-d x among them;
# k and n_j odd, around the kernels' 32-element loads and 64-column chunks.
TORCH_CASES = [((1,), 17, (15, 64, 65)), ((1, 1), 64, (65, 15, 64)), ((3,), 64, (65, 15, 64)),
               ((4,), 1025, (64, 65, 15)), ((5,), 17, (65, 64, 15)), ((2, 8), 64, (15, 65, 64)),
               ((17,), 1025, (64, 15, 65)), ((4, 16), 17, (65, 64, 15))]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("lead,k,sizes", TORCH_CASES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_against_torch(dtype, spec, lead, k, sizes, bias):
    epi, n = spec
    x, ws, bs, res = make_case(dtype, epi, n, lead, k, sizes, bias, scale=1 / math.sqrt(k))
    want = torch_ref(x, ws, bs, epi, res)
    got = group(*hr_all(x, ws, bs, res)[:3], epi, None if res is None else to_hr(res))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        check(g, w, k)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 40])
def test_strided_inputs_and_outputs(dtype, spec, m):
    """x with its feature dim strided (not rows of one stride), x rows a
    narrowed slice (rows of one stride, further apart than k), weights
    transposed in memory, a strided bias; outputs into every other column of
    a larger buffer and into a narrowed slice of wider rows."""
    epi, n = spec
    k, sizes = 33, (37, 15, 64)
    x, ws, bs, res = make_case(dtype, epi, n, (2, m), k, sizes, True, seed=3, scale=1 / math.sqrt(k))
    want = torch_ref(x, ws, bs, epi, res)
    hres = None if res is None else to_hr(res)
    xs = to_hr(x.transpose(0, 2).contiguous()).transpose(0, 2)
    big = torch.cat([x, rand(2, m, 5, dtype=dtype, seed=4)], dim=2)
    xn = to_hr(big).narrow(2, 0, k)
    wt = [to_hr(w.t().contiguous()).transpose(0, 1) for w in ws]
    bst = [to_hr(torch.stack([b, b], dim=1)).select(1, 0) for b in bs]
    assert not xs.is_contiguous() and not xn.is_contiguous() and not wt[0].is_contiguous()
    nout = len(want)
    for xv in (xs, xn):
        for wv, bv in ((wt, bst), ([to_hr(w) for w in ws], [to_hr(b) for b in bs])):
            got = group(xv, wv, bv, epi, hres)
            for g, w in zip(got, want):
                check(g, w, k)
            # bit for bit as the separate ops on the same views
            for g, s in zip(got, separate(xv, wv, bv, epi, hres)):
                assert raw(g) == raw(s)
            # into every other column of a larger buffer
            bases = [to_hr(torch.zeros(2, m, 2 * w.shape[-1], dtype=TORCH_DTYPE[dtype])) for w in want]
            outs = [b.slice(2, 0, None, 2) for b in bases]
            ret = group(xv, wv, bv, epi, hres, out=outs if nout > 1 else outs[0])
            for b, w, r, o in zip(bases, want, ret, outs):
                assert r.handle.value == o.handle.value
                t = to_torch(b)
                assert torch.all(t[..., 1::2] == 0)
                check(to_hr(t[..., 0::2]), w, k)
            # into the first columns of wider rows
            bases = [to_hr(torch.full((2, m, w.shape[-1] + 3), 7.0, dtype=TORCH_DTYPE[dtype])) for w in want]
            outs = [b.narrow(2, 0, w.shape[-1]) for b, w in zip(bases, want)]
            group(xv, wv, bv, epi, hres, out=outs if nout > 1 else outs[0])
            for b, w in zip(bases, want):
                t = to_torch(b)
                assert torch.all(t[..., w.shape[-1]:] == 7)
                check(to_hr(t[..., :w.shape[-1]].contiguous()), w, k)


# ---- bit for bit as the separate ops ----------------------------------------

# (leading dims, k, n_j): every decode row count around the fused kernel's
# limits (bf16: up to 4 rows, f32/f16: up to 16), prefill rows past them,
# 3-d x; the last one 16 rows against 2048 weight rows (many column
# chunks, shared between the threads).
BIT_CASES = [((1,), 17, (15, 64, 65)), ((2,), 64, (65, 15, 64)), ((3,), 1025, (64, 65, 15)),
             ((4,), 33, (65, 64, 15)), ((5,), 64, (15, 65, 64)), ((2, 8), 17, (64, 15, 65)),
             ((17,), 64, (65, 64, 15)), ((1, 40), 33, (15, 65, 64)), ((16,), 64, (2048, 65, 15))]


def exact_gated_case(dtype, rows):
    """x rows (gate, up) and weights that pick one each (products exact),
    8 columns (a whole SIMD vector): gate values across silu's range, one
    pair where a rounding of the activation shows in f16."""
    gate = torch.linspace(-9, 9, rows)
    gate[rows // 2] = -1.84375
    x = torch.stack([gate, torch.full((rows,), 3.0)], dim=1).to(TORCH_DTYPE[dtype])
    wg = torch.tensor([[1.0, 0.0]] * 8).to(TORCH_DTYPE[dtype])
    wu = torch.tensor([[0.0, 1.0]] * 8).to(TORCH_DTYPE[dtype])
    return x, [wg, wu]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fuse", [None, "0"], ids=["fused", "unfused"])
def test_bits_as_separate_ops(request, monkeypatch, linear_isa, fuse, dtype, spec):
    epi, n = spec
    set_fuse(monkeypatch, fuse)
    diffs = []
    for i, (lead, k, sizes) in enumerate(BIT_CASES):
        x, ws, bs, res = make_case(dtype, epi, n, lead, k, sizes, i % 2 == 1, seed=i)
        hx, hws, hbs, hres = hr_all(x, ws, bs, res)
        views = [("plain", hx)]
        if len(lead) == 1 and lead[0] <= 5:
            # one row broadcast to all (row stride 0), and x rows narrowed
            # from wider ones (rows of one stride, not k)
            views.append(("expanded", to_hr(x[:1]).expand(lead[0], k)))
            wide = torch.cat([x, rand(*lead, 3, dtype=dtype, seed=i + 40)], dim=-1)
            views.append(("narrowed", to_hr(wide).narrow(1, 0, k)))
        for name, xv in views:
            want = separate(xv, hws, hbs, epi, hres)
            got = group(xv, hws, hbs, epi, hres)
            assert len(got) == len(want)
            for j, (g, w) in enumerate(zip(got, want)):
                assert g.shape == w.shape and g.dtype == w.dtype
                if raw(g) != raw(w):
                    d = (to_torch(g).double() - to_torch(w).double()).abs().max().item()
                    diffs.append(f"x {tuple(lead)}x{k} ({name}), output {j}: max diff {d}")
    if epi in ("silu_mul", "gelu_tanh_mul"):
        x, ws = exact_gated_case(dtype, 4 if dtype == "bf16" else 16)
        hx, hws = to_hr(x), [to_hr(w) for w in ws]
        g, w = group(hx, hws, None, epi, None)[0], separate(hx, hws, None, epi, None)[0]
        if raw(g) != raw(w):
            diffs.append(f"exact products: {to_torch(g)[:, 0].tolist()} != {to_torch(w)[:, 0].tolist()}")
    assert not diffs, "\n".join(diffs)


# ---- weights packed into panels (hr_linear_pack) ------------------------------

_pack = fn("hr_linear_pack", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_bool)])


def pack(t):
    """Packs weight t (hr_linear_pack); True when a packed copy was made."""
    packed = ctypes.c_bool()
    hr_check(_pack(t.handle, ctypes.byref(packed)))
    return packed.value


@pytest.fixture(params=["avx2", "avx512", "amx"])
def packed_isa(request):
    """The panel kernels: AVX2 (bf16 and f16 panels), AVX-512 BF16 and AMX
    (tiles or their emulator), each where the CPU has it."""
    before = use_isa(request.param)
    yield request.param
    lib.hr_cpu_isa_set(before)


@pytest.mark.parametrize("spec", [("store", 3), ("silu_mul", 2), ("gelu_tanh_mul", 2), ("residual", 1)],
                         ids=["store3", "silu_mul2", "gelu_tanh_mul2", "residual1"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("fuse", [None, "0"], ids=["fused", "unfused"])
def test_packed_weights(request, monkeypatch, packed_isa, fuse, dtype, spec):
    """Weights packed into panels: the group reads them as linear does (the
    fused kernel one panel per chunk), so each output has the bytes of linear
    on the same packed weights, then the epilogue op. Row counts from 1 to
    past the panel route's 256; n_j around the 64-row panels."""
    epi, n = spec
    set_fuse(monkeypatch, fuse)
    diffs = []
    for i, rows in enumerate([1, 3, 4, 5, 6, 16, 17, 64, 300]):
        k = 129 if i % 2 else 64
        x, ws, bs, res = make_case(dtype, epi, n, (rows,), k, (65, 1, 129) if i % 3 else (129, 63, 64), i % 2 == 0,
                                   seed=i, scale=1 / math.sqrt(k))
        hx, hws, hbs, hres = hr_all(x, ws, bs, res)
        packed = [pack(w) for w in hws]
        if not any(packed):
            pytest.skip(f"no {dtype} panels under {packed_isa}")
        assert all(packed)
        want = separate(hx, hws, hbs, epi, hres)
        got = group(hx, hws, hbs, epi, hres)
        for j, (g, w, t) in enumerate(zip(got, want, torch_ref(x, ws, bs, epi, res))):
            check(g, t, k)
            if raw(g) != raw(w):
                d = (to_torch(g).double() - to_torch(w).double()).abs().max().item()
                diffs.append(f"{rows} rows, k {k}, output {j}: max diff {d}")
    if epi in ("silu_mul", "gelu_tanh_mul"):
        x, ws = exact_gated_case(dtype, 4 if dtype == "bf16" else 16)
        hx, hws = to_hr(x), [to_hr(w) for w in ws]
        assert all(pack(w) for w in hws)
        g, w = group(hx, hws, None, epi, None)[0], separate(hx, hws, None, epi, None)[0]
        if raw(g) != raw(w):
            diffs.append(f"exact products: {to_torch(g)[:, 0].tolist()} != {to_torch(w)[:, 0].tolist()}")
    assert not diffs, "\n".join(diffs)


# ---- the residual in place ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fuse", [None, "0"], ids=["fused", "unfused"])
@pytest.mark.parametrize("lead", [(1,), (4,), (2, 20)])
def test_residual_in_place(monkeypatch, fuse, dtype, lead):
    """out=res, the same tensor: the output is y + the residual as it was
    (bit for bit as linear then add into a fresh tensor), also where res is
    a view into wider rows (the other columns untouched)."""
    set_fuse(monkeypatch, fuse)
    k, m = 65, 37
    x, ws, bs, res = make_case(dtype, "residual", 1, lead, k, (m,), True, seed=5, scale=1 / math.sqrt(k))
    hx, hws, hbs, _ = hr_all(x, ws, bs, None)
    want = separate(hx, hws, hbs, "residual", to_hr(res))[0]
    ref = torch_ref(x, ws, bs, "residual", res)[0]
    h = to_hr(res)
    got = hubrt.ops.linear_group(hx, hws, hbs, epilogue="residual", residual=h, out=h)
    assert got.handle.value == h.handle.value
    assert raw(h) == raw(want)
    check(h, ref, k)
    # res a narrowed view of wider rows, updated in place through the view
    wide = torch.cat([res, torch.full((*lead, 3), 5.0, dtype=TORCH_DTYPE[dtype])], dim=-1)
    base = to_hr(wide)
    view = base.narrow(len(lead), 0, m)
    hubrt.ops.linear_group(hx, hws, hbs, epilogue="residual", residual=view, out=view)
    t = to_torch(base)
    assert torch.all(t[..., m:] == 5)
    assert raw(to_hr(t[..., :m].contiguous())) == raw(want)
    # twice in a row: the second adds onto the first's result
    again = hubrt.ops.linear_group(hx, hws, hbs, epilogue="residual", residual=h, out=h)
    assert raw(again) == raw(hubrt.ops.add(hubrt.ops.linear(hx, hws[0], hbs[0]), want))


@pytest.mark.parametrize("fuse", [None, "0"], ids=["fused", "unfused"])
@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("spec", [("store", 2), ("silu_mul", 2)], ids=["store2", "silu_mul2"])
def test_out_aliasing_x(request, monkeypatch, fuse, rows, spec):
    """An output that is exactly x's view (n_j == k): the op must either
    give the result it gives into separate storage or refuse the output
    (the dispatcher refuses it: every output element reads a whole row of
    x, which the unfused path would have overwritten by then)."""
    epi, n = spec
    set_fuse(monkeypatch, fuse)
    k = 32
    x, ws, _, _ = make_case("f32", epi, n, (rows,), k, (k, k), False, seed=6, scale=1 / math.sqrt(k))
    hx, hws = to_hr(x), [to_hr(w) for w in ws]
    want = group(hx, hws, None, epi, None)  # into fresh tensors
    outs = [hx, to_hr(torch.zeros(rows, k))] if epi == "store" else hx
    try:
        got = group(hx, hws, None, epi, None, out=outs)
    except HubrtError:
        return  # refusing the aliased output is fine too
    for g, w in zip(got, want):
        assert raw(g) == raw(w)


# ---- the xla_cpu device ------------------------------------------------------


@pytest.fixture(scope="module")
def xla_cpu():
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable (pip install xla-cpu-pjrt): {e}")
    return "xla_cpu"


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,k,sizes", [((1,), 17, (15, 64, 65)), ((5,), 64, (65, 15, 33)),
                                          ((2, 3), 33, (64, 65, 15))])
def test_xla_cpu(xla_cpu, dtype, spec, lead, k, sizes):
    """The StableHLO lowering: close to the CPU's result (and torch's)
    within linear's tolerance, on the device."""
    epi, n = spec
    x, ws, bs, res = make_case(dtype, epi, n, lead, k, sizes, len(lead) != 1 or lead[0] != 1, seed=7,
                               scale=1 / math.sqrt(k))
    hx, hws, hbs, hres = hr_all(x, ws, bs, res)
    dev = [t.to(xla_cpu) for t in [hx, *hws, *(hbs or []), *([hres] if hres is not None else [])]]
    dx, dws = dev[0], dev[1:1 + n]
    dbs = dev[1 + n:1 + 2 * n] if bs is not None else None
    dres = dev[-1] if res is not None else None
    got = group(dx, dws, dbs, epi, dres)
    cpu = group(hx, hws, hbs, epi, hres)
    want = torch_ref(x, ws, bs, epi, res)
    assert len(got) == len(cpu) == len(want)
    for g, c, w in zip(got, cpu, want):
        assert g.device == f"{xla_cpu}:0"
        check(g, to_torch(c).double(), k)
        check(g, w, k)


# ---- bad input ---------------------------------------------------------------


def _t(*shape, dtype="f32"):
    return to_hr(torch.ones(*shape, dtype=TORCH_DTYPE[dtype]))


X, W, W16 = _t(3, 17), _t(15, 17), _t(16, 17)
BAD = {
    "gated_n1": (lambda: hubrt.ops.linear_group(X, [W], epilogue="silu_mul"),
                 r"gated epilogue takes 2 linears, got 1"),
    "gelu_gated_n3": (lambda: hubrt.ops.linear_group(X, [W, W, W], epilogue="gelu_tanh_mul"),
                      r"gated epilogue takes 2 linears, got 3"),
    "residual_n2": (lambda: hubrt.ops.linear_group(X, [W, W], epilogue="residual", residual=_t(3, 15)),
                    r"residual epilogue takes 1 linear, got 2"),
    "gate_up_sizes": (lambda: hubrt.ops.linear_group(X, [W, W16], epilogue="silu_mul"),
                      r"gate and up give 15 and 16 features"),
    "too_few_inputs": (lambda: hubrt.ops.call("linear_group", X, W, n=2), r"2 linears take 3 inputs, got 2"),
    "too_many_inputs": (lambda: hubrt.ops.call("linear_group", X, W, W, n=1), r"1 linears take 2 inputs, got 3"),
    "missing_biases": (lambda: hubrt.ops.call("linear_group", X, W, W, _t(15), n=2, bias=True),
                       r"2 linears with biases take 5 inputs, got 4"),
    "missing_residual": (lambda: hubrt.ops.linear_group(X, [W], epilogue="residual"),
                         r"1 linears and a residual take 3 inputs, got 2"),
    "residual_shape": (lambda: hubrt.ops.linear_group(X, [W], epilogue="residual", residual=_t(3, 16)),
                       r"the residual is \[3, 16\] f32, the product \[3, 15\] f32"),
    "residual_dtype": (lambda: hubrt.ops.linear_group(X, [W], epilogue="residual", residual=_t(3, 15, dtype="f16")),
                       r"the residual is \[3, 15\] f16, the product \[3, 15\] f32"),
    "weight_dtype": (lambda: hubrt.ops.linear_group(X, [W, _t(15, 17, dtype="bf16")]),
                     r"member 1: linear: input 0 \(x\) is f32 but input 1 \(weight\) is bf16"),
    "x_dtype": (lambda: hubrt.ops.linear_group(_t(3, 17, dtype="f16"), [_t(15, 17, dtype="f16"), W]),
                r"member 1: linear: input 0 \(x\) is f16 but input 1 \(weight\) is f32"),
    "weight_k": (lambda: hubrt.ops.linear_group(X, [W, _t(15, 18)]), r"member 1"),
    "bias_shape": (lambda: hubrt.ops.linear_group(X, [W, W16], [_t(15), _t(15)]),
                   r"member 1: linear: input 2 \(bias\) must be \[16\], got \[15\]"),
    "unknown_epilogue": (lambda: hubrt.ops.call("linear_group", X, W, n=1, epilogue=7), r"unknown epilogue 7"),
    "out_shape": (lambda: hubrt.ops.linear_group(X, [W, W16], out=[_t(3, 15), _t(3, 15)]),
                  r"output 1 is \[3, 15\] f32 but the result is \[3, 16\] f32"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(case):
    f, pattern = BAD[case]
    with pytest.raises(HubrtError, match=r"linear_group.*" + pattern):
        f()


@pytest.mark.parametrize("n", [0, 4])
def test_bad_count_names_n(request, n):
    """n outside 1..3 is refused before anything runs, with a HubrtError
    naming n (infer_linear_group's "n must be 1..3, got 4"); n = 0 leaves x
    alone, which the input count refuses first."""
    with pytest.raises(HubrtError, match=f"n must be 1..3, got {n}" if n else "takes 2..8 inputs, got 1"):
        hubrt.ops.linear_group(X, [W] * n)
