"""Every op of the catalog on the xla_cpu PJRT device against torch and
against the cpu device: the StableHLO lowerings, device views (strided,
offset, broadcast inputs; strided outputs), and the executable cache."""
import numpy as np
import pytest
import torch

import hubrt
from hubrt._lib import HubrtError
from oracle import TOL, assert_close, to_hr, to_torch

DEV = "xla_cpu"


@pytest.fixture(scope="module", autouse=True)
def xla_cpu():
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to(DEV)
    except HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable (pip install xla-cpu-pjrt): {e}")


def on_dev(t):
    return to_hr(t).to(DEV)


def check(name, inputs, want, atol=None, rtol=None, **attrs):
    """Runs op `name` on xla_cpu, compares with torch `want`, and with the cpu
    device when it has a kernel for the op."""
    got = hubrt.ops.call(name, *[None if t is None else on_dev(t) for t in inputs], **attrs)
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    for g, w in zip(gots, wants):
        assert g.device == f"{DEV}:0"
        assert_close(g, w, atol=atol, rtol=rtol)
    try:
        ref = hubrt.ops.call(name, *[None if t is None else to_hr(t) for t in inputs], **attrs)
    except HubrtError as e:
        if "no cpu kernel" in str(e):
            return
        raise
    refs = ref if isinstance(ref, tuple) else (ref,)
    for g, r in zip(gots, refs):
        assert_close(g, to_torch(r).double() if r.dtype in TOL else to_torch(r), atol=atol, rtol=rtol)


FLOATS = ["f32", "bf16", "f16"]
TD = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def rand(*shape, dtype="f32", lo=-2.0, hi=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(TD[dtype])


# ---- elementwise -----------------------------------------------------------

BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((3, 17), (3, 17)), ((2, 1, 5), (4, 1)), ((4097,), ())])
def test_binary(name, dtype, shapes):
    lo = 0.5 if name == "pow" else -2.0
    a, b = rand(*shapes[0], dtype=dtype, lo=lo, seed=1), rand(*shapes[1], dtype=dtype, lo=0.5, seed=2)
    want = BINARY[name](a.float(), b.float()).to(TD[dtype])
    check(name, [a, b], want)


@pytest.mark.parametrize("dtype", ["i64", "i32", "u8"])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "maximum", "minimum"])
def test_binary_int(name, dtype):
    tdt = {"i64": torch.int64, "i32": torch.int32, "u8": torch.uint8}[dtype]
    a = torch.arange(0, 34).reshape(2, 17).to(tdt)
    b = torch.arange(5, 22).to(tdt)
    check(name, [a, b], BINARY[name](a, b))


UNARY = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
         "rsqrt": torch.rsqrt, "abs": torch.abs, "relu": torch.relu, "sigmoid": torch.sigmoid,
         "tanh": torch.tanh, "silu": torch.nn.functional.silu}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    lo = 0.1 if name in ("log", "sqrt", "rsqrt") else -3.0
    x = rand(3, 17, dtype=dtype, lo=lo, hi=3.0)
    check(name, [x], UNARY[name](x.float()).to(TD[dtype]))


@pytest.mark.parametrize("approx", [0, 1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu_and_gelu_mul(approx, dtype):
    x, y = rand(4097, dtype=dtype, lo=-5, hi=5), rand(4097, dtype=dtype, seed=3)
    mode = "tanh" if approx else "none"
    g = torch.nn.functional.gelu(x.float(), approximate=mode)
    check("gelu", [x], g.to(TD[dtype]), approximate=approx)
    check("gelu_mul", [x, y], (g * y.float()).to(TD[dtype]), approximate=approx)


@pytest.mark.parametrize("dtype", FLOATS)
def test_silu_mul_clamp_scale(dtype):
    x, y = rand(5, 7, dtype=dtype), rand(7, dtype=dtype, seed=4)
    check("silu_mul", [x, y], (torch.nn.functional.silu(x.float()) * y.float()).to(TD[dtype]))
    check("clamp", [x], x.float().clamp(-0.5, 0.75).to(TD[dtype]), min=-0.5, max=0.75, has_min=True,
          has_max=True)
    check("clamp", [x], x.float().clamp(max=0.25).to(TD[dtype]), max=0.25, has_max=True)
    check("scale", [x], (x.float() * 1.5 + 0.25).to(TD[dtype]), mul=1.5, add=0.25)


def test_clamp_int_and_nan():
    a = torch.arange(-10, 10, dtype=torch.int64)
    check("clamp", [a], a.clamp(-3, 4), min=-3.0, max=4.0, has_min=True, has_max=True)
    x = torch.tensor([float("nan"), -5.0, 5.0])
    check("clamp", [x], x.clamp(-1, 1), min=-1.0, max=1.0, has_min=True, has_max=True)
    check("relu", [x], torch.relu(x))


def test_where():
    c = torch.rand(3, 1, 5) > 0.5
    a, b = rand(4, 5), rand(3, 4, 1, seed=5)
    check("where", [c, a, b], torch.where(c, a, b))


@pytest.mark.parametrize("src,dst", [("f32", "bf16"), ("bf16", "f32"), ("f32", "i64"), ("f16", "i32"),
                                     ("i64", "f32"), ("f32", "bool"), ("bool", "f32"), ("i32", "i8")])
def test_cast(src, dst):
    from oracle import TORCH_DTYPE
    x = torch.tensor([-3.7, -1.0, -0.0, 0.0, 0.4, 1.5, 2.5, 100.9])
    if src == "bool":
        x = x > 0
    else:
        x = x.to(TORCH_DTYPE[src])
    check("cast", [x], x.to(TORCH_DTYPE[dst]), dtype=dst)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i64", "bool"])
def test_fill_and_arange(dtype):
    got = hubrt.ops.fill([2, 3], 1.5 if dtype != "i64" else 7, dtype=dtype, device=DEV)
    assert got.device == f"{DEV}:0"
    from oracle import TORCH_DTYPE
    assert_close(got, torch.full((2, 3), 1.5 if dtype != "i64" else 7).to(TORCH_DTYPE[dtype]))
    if dtype != "bool":
        got = hubrt.ops.arange(1, 9.5, 0.5 if dtype != "i64" else 2, dtype=dtype, device=DEV)
        want = torch.arange(1, 9.5, 0.5 if dtype != "i64" else 2, dtype=torch.float64).to(TORCH_DTYPE[dtype])
        assert_close(got, want)


# ---- reductions ------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "argmax"])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (-1, True), (1, False)])
def test_reduce(name, dtype, dim, keepdim):
    x = rand(3, 17, 5, dtype=dtype)
    f = {"sum": lambda t: t.sum(dim, keepdim=keepdim), "mean": lambda t: t.mean(dim, keepdim=keepdim),
         "max": lambda t: t.amax(dim, keepdim=keepdim), "min": lambda t: t.amin(dim, keepdim=keepdim),
         "argmax": lambda t: t.argmax(dim, keepdim=keepdim)}[name]
    want = f(x.float())
    if name != "argmax":
        want = want.to(TD[dtype])
    check(name, [x], want, dim=dim, keepdim=keepdim)


def test_reduce_int_and_long_rows():
    a = torch.arange(-20, 20, dtype=torch.int32).reshape(4, 10)
    check("sum", [a], a.sum(1), dim=1)
    check("max", [a], a.amax(0), dim=0)
    x = rand(2, 4097)
    check("sum", [x], x.sum(-1), dim=-1, rtol=1e-4)
    check("argmax", [x], x.argmax(-1), dim=-1)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_log_softmax_cumsum(dtype):
    x = rand(3, 17, dtype=dtype, lo=-6, hi=6)
    check("softmax", [x], torch.softmax(x.float(), -1).to(TD[dtype]), dim=-1)
    check("log_softmax", [x], torch.log_softmax(x.float(), 0).to(TD[dtype]), dim=0)
    atol = {"f32": 1e-5, "bf16": 0.1, "f16": 1e-2}[dtype]
    check("cumsum", [x], torch.cumsum(x.float(), 1).to(TD[dtype]), dim=1, atol=atol)
    i = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    check("cumsum", [i], torch.cumsum(i, 1), dim=1)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = torch.randperm(4 * 33, generator=torch.Generator().manual_seed(0)).float().reshape(4, 33)
    v, i = torch.topk(x, 5, dim=-1, largest=largest)
    check("topk", [x], (v, i), k=5, dim=-1, largest=largest, sorted=True)


# ---- linear algebra and attention ------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("sa,sb", [((3, 17), (17, 5)), ((2, 1, 4, 8), (3, 8, 6)), ((8,), (8, 3)), ((2, 5, 8), (8,))])
def test_matmul(dtype, sa, sb):
    a, b = rand(*sa, dtype=dtype), rand(*sb, dtype=dtype, seed=7)
    check("matmul", [a, b], torch.matmul(a.float(), b.float()).to(TD[dtype]), rtol=TOL[dtype][1] * 4)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bias", [False, True])
def test_linear(dtype, bias):
    x, w = rand(2, 3, 33, dtype=dtype), rand(17, 33, dtype=dtype, seed=8)
    b = rand(17, dtype=dtype, seed=9) if bias else None
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    check("linear", [x, w, b], want.to(TD[dtype]), rtol=TOL[dtype][1] * 4)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("causal,window,softcap,mask", [(True, 0, 0.0, None), (False, 0, 0.0, "bool"),
                                                        (True, 3, 0.0, None), (False, 0, 5.0, "add")])
@pytest.mark.parametrize("batch,hq,hkv", [(1, 4, 2), (2, 6, 2), (2, 3, 3)])
def test_sdpa(dtype, causal, window, softcap, mask, batch, hq, hkv):
    """Grouped query heads (2 and 3 per kv head) and plain multi-head."""
    q = rand(batch, hq, 3, 8, dtype=dtype)
    k, v = rand(batch, hkv, 7, 8, dtype=dtype, seed=10), rand(batch, hkv, 7, 8, dtype=dtype, seed=11)
    m = None
    if mask == "bool":
        m = torch.rand(batch, 1, 3, 7, generator=torch.Generator().manual_seed(3)) > 0.3
        m[..., 0] = True
    elif mask == "add":
        m = rand(1, hq, 3, 7, lo=-1, hi=0, seed=12)
    g = hq // hkv
    qf, kf, vf = q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2) / 8 ** 0.5
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if m is not None:
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
    pos_q = torch.arange(3)[:, None] + 4
    pos_k = torch.arange(7)[None, :]
    if causal:
        s = s.masked_fill(pos_k > pos_q, float("-inf"))
    if window:
        s = s.masked_fill(pos_q - pos_k >= window, float("-inf"))
    want = (torch.softmax(s, -1) @ vf).to(TD[dtype])
    check("sdpa", [q, k, v, m], want, is_causal=causal, window=window, softcap=softcap)


# ---- indexing and data movement --------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_embedding_index_select_gather(dtype):
    w = rand(11, 6, dtype=dtype)
    ids = torch.tensor([[3, 0, 10], [7, 7, 1]])
    check("embedding", [w, ids], torch.nn.functional.embedding(ids, w))
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    check("index_select", [w, idx], w.index_select(0, idx.long()), dim=0)
    check("index_select", [w, idx], w.index_select(1, idx.long()), dim=1)
    g = torch.randint(0, 6, (11, 4), generator=torch.Generator().manual_seed(1))
    check("gather", [w, g], torch.gather(w, 1, g), dim=1)


def test_index_copy_and_cat():
    dst, src = rand(5, 3, 4), rand(5, 2, 4, seed=1)
    idx = torch.tensor([2, 0])
    d = on_dev(dst)
    hubrt.ops.index_copy_(d, 1, to_hr(idx).to(DEV), on_dev(src))
    assert_close(d, dst.index_copy(1, idx, src))
    parts = [rand(2, 3, seed=i) for i in range(3)] + [torch.zeros(2, 0)]
    check("cat", parts, torch.cat(parts, 1), dim=1)
    check("cat", parts[:1], parts[0], dim=0)


def test_strided_inputs_on_device():
    """Transposed, sliced (offset) and broadcast device views feed ops."""
    x = rand(6, 8)
    d = on_dev(x)
    assert_close(hubrt.ops.contiguous(d.transpose(0, 1)), x.t())
    assert_close(hubrt.ops.add(d.slice(1, 2, 7, 2), d.slice(1, 1, 6, 2)), x[:, 2:7:2] + x[:, 1:6:2])
    assert_close(hubrt.ops.exp(d.select(0, 3)), torch.exp(x[3]))
    row = on_dev(rand(8, seed=2))
    assert_close(hubrt.ops.mul(row.unsqueeze(0).expand(6, 8), d), to_torch(row.to("cpu")) * x)
    assert_close(d.narrow(0, 2, 3), x[2:5])  # numpy() of an offset view


def test_strided_outputs_on_device():
    """Writes into a KV-cache-like slice and a transposed view of a device buffer."""
    cache = torch.zeros(1, 2, 6, 4)
    c = on_dev(cache)
    for pos in range(3):
        step = rand(1, 2, 1, 4, seed=pos)
        hubrt.ops.copy(on_dev(step), out=c.slice(2, pos, pos + 1))
        cache[:, :, pos:pos + 1] = step
    assert_close(c, cache)
    m = on_dev(torch.zeros(3, 5))
    hubrt.ops.call("add", on_dev(torch.ones(5, 3)), on_dev(torch.ones(5, 3)), out=m.transpose(0, 1))
    assert_close(m, torch.full((3, 5), 2.0))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "i64", "i32", "i16", "i8", "u8", "bool", "f64"])
def test_round_trip(dtype):
    from oracle import TORCH_DTYPE
    t = (torch.arange(-6, 11) * 3).to(TORCH_DTYPE[dtype]).reshape(1, 17)
    d = to_hr(t).to(DEV)
    assert d.device == f"{DEV}:0"
    assert_close(d, t)
    assert_close(d.to("cpu"), t)


def test_cache_hits_and_stats():
    from pjrt_util import PjrtStats, pjrt_stats

    def stats():
        return PjrtStats(**pjrt_stats(DEV))

    x, y = on_dev(rand(7, 13, seed=21)), on_dev(rand(7, 13, seed=22))
    hubrt.ops.sub(x, y)
    before = stats()
    for _ in range(3):
        hubrt.ops.sub(x, y)
    after = stats()
    assert after.requests - before.requests == 3
    assert after.hits - before.hits == 3
    assert after.misses == before.misses


# ---- normalization and positions ---------------------------------------------


def torch_rms_norm(x, w, eps, offset):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if w is None:
        return h.to(x.dtype)
    if offset:
        return (h * (offset + w.float())).to(x.dtype)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("weight,offset", [(False, 0.0), (True, 0.0), (True, 1.0)])
def test_rms_norm(dtype, weight, offset):
    x = rand(3, 5, 64, dtype=dtype, lo=-3, hi=3)
    w = rand(64, dtype=dtype, seed=3) if weight else None
    check("rms_norm", [x, w], torch_rms_norm(x, w, 1e-6, offset), eps=1e-6, weight_offset=offset)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("weight", [False, True])
def test_add_rms_norm(dtype, weight):
    x, res = rand(3, 5, 64, dtype=dtype, lo=-3, hi=3), rand(3, 5, 64, dtype=dtype, seed=4)
    w = rand(64, dtype=dtype, seed=3) if weight else None
    total = res + x
    check("add_rms_norm", [x, res, w], (torch_rms_norm(total, w, 1e-6, 0.0), total), eps=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n_params", [1, 2, 3])
def test_layer_norm(dtype, n_params):
    x = rand(4, 33, dtype=dtype, lo=-3, hi=3)
    w = rand(33, dtype=dtype, seed=1) if n_params > 1 else None
    bias = rand(33, dtype=dtype, seed=2) if n_params > 2 else None
    want = torch.nn.functional.layer_norm(x.float(), (33,), None if w is None else w.float(),
                                          None if bias is None else bias.float(), 1e-5).to(TD[dtype])
    check("layer_norm", [x, w, bias], want, eps=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_cos_sin_and_rope(dtype):
    pos = torch.tensor([[0, 1, 2, 7, 4095]])
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    freqs = pos[..., None].float() * inv
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = (emb.cos() * 0.5).to(TD[dtype]), (emb.sin() * 0.5).to(TD[dtype])
    atol = 2e-5 if dtype == "f32" else None
    check("rope_cos_sin", [pos, inv], (cos, sin), attention_scaling=0.5, dtype=dtype, atol=atol)
    # partial rotary: the first 16 of 24 features rotate, cos broadcasts over heads
    x = rand(1, 2, 5, 24, dtype=dtype)
    c, s = cos[:, None], sin[:, None]
    x1, x2, rest = x[..., :8], x[..., 8:16], x[..., 16:]
    want = torch.cat([x1 * c[..., :8] - x2 * s[..., :8], x2 * c[..., 8:] + x1 * s[..., 8:], rest], -1)
    check("rope", [x, c, s], want)


def test_empty_inputs():
    """Size-0 inputs with non-empty outputs: empty sums, k = 0 matmuls."""
    x = torch.zeros(3, 0)
    check("sum", [x], x.sum(1), dim=1)
    a, b = torch.zeros(2, 0), torch.zeros(0, 5)
    check("matmul", [a, b], a @ b)


# ---- image ops ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 0, 1, 1), (1, 2, 2, 2)])
def test_conv2d_on_xla(dtype, stride, padding, dilation, groups):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, 4, 9, 7), generator=g).to(TD[dtype])
    w = (torch.randn((6, 4 // groups, 3, 3), generator=g) * 0.3).to(TD[dtype])
    bias = torch.randn((6,), generator=g).to(TD[dtype])
    want = torch.nn.functional.conv2d(x.float(), w.float(), bias.float(), stride, padding, dilation, groups)
    check("conv2d", [x, w, bias], want.to(TD[dtype]), stride_h=stride, stride_w=stride, pad_h=padding, pad_w=padding,
          dilation_h=dilation, dilation_w=dilation, groups=groups)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_group_norm_and_upsample_on_xla(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn((2, 8, 5, 6), generator=g) * 2 + 1).to(TD[dtype])
    w, bias = torch.randn((8,), generator=g).to(TD[dtype]), torch.randn((8,), generator=g).to(TD[dtype])
    want = torch.nn.functional.group_norm(x.float(), 4, w.float(), bias.float(), 1e-6).to(TD[dtype])
    check("group_norm", [x, w, bias], want, groups=4, eps=1e-6)
    check("upsample_nearest", [x], torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"), scale=2)
