"""experts: a mixture-of-experts layer's experts given the router's
choice. Against transformers' own eager experts loop (Qwen3MoeExperts'
forward, run on the same stacked weights; for gelu-tanh and biases the same
loop in torch), under every CPU ISA and dtype; the per-expert order bit for
bit equal to grouped in f32; routing edge cases (every token to one expert,
empty experts, top-k = E, sentinel indices); strided inputs; the xla_cpu
device; bad input."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from hubrt._lib import HubrtError
from oracle import TOL, TORCH_DTYPE, assert_close, to_hr, to_torch


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed * 1009 + sum(shape) * 7 + len(shape))
    return torch.randn(*shape, generator=g) * scale


def case(t, h, i, e, k, seed=0, bias=False, route="random"):
    """x [t, h], routing weights [t, k] and indices [t, k], gate_up [e, 2i, h],
    down [e, h, i] (f32), biases or None."""
    x = rand(t, h, seed=seed)
    gu = rand(e, 2 * i, h, seed=seed + 1, scale=1 / math.sqrt(h))
    dn = rand(e, h, i, seed=seed + 2, scale=1 / math.sqrt(i))
    logits = rand(t, e, seed=seed + 3)
    if route == "one":  # every token to expert e - 1 first: the others mostly empty
        logits[:, -1] += 100
    probs = torch.softmax(logits, -1)
    w, idx = torch.topk(probs, k, -1)
    w = w / w.sum(-1, keepdim=True)
    b = (rand(e, 2 * i, seed=seed + 4), rand(e, h, seed=seed + 5)) if bias else (None, None)
    return x, w, idx, gu, dn, *b


def torch_loop(x, w, idx, gu, dn, bgu=None, bdn=None, act="silu"):
    """transformers' eager experts loop (Qwen3MoeExperts.forward), biases and
    gelu-tanh added the way Gemma 4 / gpt-oss-style experts add them; in x's
    dtype, each product rounded as torch stores it."""
    e = gu.shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(idx, num_classes=e + 1).permute(2, 1, 0)
    for ex in range(e):
        pos, tok = torch.where(mask[ex])
        if tok.numel() == 0:
            continue
        g, u = F.linear(x[tok], gu[ex], None if bgu is None else bgu[ex]).chunk(2, dim=-1)
        a = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u
        y = F.linear(a, dn[ex], None if bdn is None else bdn[ex])
        y = y * w[tok, pos, None].to(x.dtype)
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def transformers_experts(x, w, idx, gu, dn):
    """The same through transformers' Qwen3MoeExperts module itself."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    e, i2, h = gu.shape
    cfg = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=i2 // 2, num_experts=e, hidden_act="silu")
    mod = Qwen3MoeExperts(cfg).to(x.dtype)
    with torch.no_grad():
        mod.gate_up_proj.copy_(gu)
        mod.down_proj.copy_(dn)
        return mod(x, idx, w.to(x.dtype))


def run(x, w, idx, gu, dn, bgu=None, bdn=None, dtype="f32", **kw):
    td = TORCH_DTYPE[dtype]
    hr = [to_hr(t.to(td)) for t in (x, w, gu, dn)]
    b = [None if t is None else to_hr(t.to(td)) for t in (bgu, bdn)]
    return hubrt.ops.experts(hr[0], hr[1], to_hr(idx), hr[2], hr[3], b[0], b[1], **kw)


def tol(dtype, k):
    atol, rtol = TOL[dtype]
    return dict(atol=atol * math.sqrt(k) * (4 if dtype != "f32" else 1), rtol=rtol * 2)


# (tokens, hidden, intermediate, experts, top-k): decode (1, 4 tokens), a
# batch, prefill; odd sizes around the kernels' blocks; top-1 and top-k = E
SHAPES = [(1, 64, 32, 8, 2), (4, 33, 17, 8, 1), (16, 64, 48, 8, 8), (37, 65, 31, 16, 4), (130, 128, 64, 8, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_against_transformers(shape, isa):  # noqa: F811
    t, h, i, e, k = shape
    x, w, idx, gu, dn, _, _ = case(t, h, i, e, k)
    want = transformers_experts(x, w, idx, gu, dn)
    assert torch.equal(want, torch_loop(x, w, idx, gu, dn))  # the reference loop is transformers'
    for per_expert in (False, True):
        got = run(x, w, idx, gu, dn, per_expert=per_expert)
        assert_close(got, want, **tol("f32", h))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_dtypes_acts_biases(dtype, act, bias):
    x, w, idx, gu, dn, bgu, bdn = case(9, 64, 40, 8, 2, seed=3, bias=bias)
    td = TORCH_DTYPE[dtype]
    ref = [None if t is None else t.to(td) for t in (x, w, gu, dn, bgu, bdn)]
    want = torch_loop(ref[0], ref[1], idx, ref[2], ref[3], ref[4], ref[5], act=act)
    for per_expert in (False, True):
        got = run(x, w, idx, gu, dn, bgu, bdn, dtype=dtype, act=act, per_expert=per_expert)
        assert got.dtype == dtype
        assert_close(got, want.float(), dtype=dtype, **tol(dtype, 64))


def test_per_expert_equals_grouped_in_f32():
    """Both orders add a row's slots in ascending expert order; in f32 the
    roundings per_expert adds are no-ops, so the bits agree."""
    x, w, idx, gu, dn, bgu, bdn = case(23, 64, 32, 8, 3, seed=5, bias=True)
    a = run(x, w, idx, gu, dn, bgu, bdn, per_expert=False).numpy()
    b = run(x, w, idx, gu, dn, bgu, bdn, per_expert=True).numpy()
    assert np.array_equal(a, b)


def test_bf16_per_expert_rounds_like_transformers():
    """per_expert rounds each weighted product and each add to bf16 as
    transformers' loop does; grouped rounds once. Both stay near the f32
    result, and per_expert is nearer transformers' bf16 loop."""
    x, w, idx, gu, dn, _, _ = case(64, 128, 64, 8, 8, seed=11)
    bf = [t.to(torch.bfloat16) for t in (x, w, gu, dn)]
    want = torch_loop(bf[0], bf[1], idx, bf[2], bf[3]).float()
    per = to_torch(run(x, w, idx, gu, dn, dtype="bf16", per_expert=True)).float()
    grp = to_torch(run(x, w, idx, gu, dn, dtype="bf16")).float()
    assert (per - want).abs().mean() < (grp - want).abs().mean()
    assert not torch.equal(per, grp)


@pytest.mark.parametrize("route", ["one", "random"])
def test_routing_edges(route):
    """Every token's first choice is one expert (others empty or nearly);
    sentinel slots (index E, as transformers' loop skips it, and -1) add
    nothing; a row whose slots are all sentinels is zero."""
    x, w, idx, gu, dn, _, _ = case(12, 32, 16, 8, 2, seed=7, route=route)
    idx = idx.clone()
    idx[3, 1] = 8
    idx[5, 0] = -1
    idx[6, :] = 8
    kept = torch.where(idx >= 0, idx, 8)  # the loop skips index E
    want = torch_loop(x, w, kept, gu, dn)
    got = run(x, w, idx, gu, dn)
    assert_close(got, want, **tol("f32", 32))
    assert not to_torch(got)[6].any()


def test_i32_indices_and_3d_rows():
    x, w, idx, gu, dn, _, _ = case(10, 32, 16, 8, 2, seed=9)
    want = torch_loop(x, w, idx, gu, dn)
    got = hubrt.ops.experts(to_hr(x.reshape(2, 5, 32)), to_hr(w.reshape(2, 5, 2)), to_hr(idx.int().reshape(2, 5, 2)),
                            to_hr(gu), to_hr(dn))
    assert got.shape == (2, 5, 32)
    assert_close(got, want.reshape(2, 5, 32), **tol("f32", 32))


def test_strided_inputs_and_output():
    """x's rows a narrowed slice, weights and indices transposed in memory,
    expert weights with their last two dims swapped in memory; the output
    into every other column of a wider buffer."""
    x, w, idx, gu, dn, _, _ = case(7, 32, 16, 8, 2, seed=13)
    want = torch_loop(x, w, idx, gu, dn)
    wide = to_hr(torch.cat([x, x], 1)).narrow(1, 0, 32)
    wt = to_hr(w.t().contiguous()).transpose(0, 1)
    it = to_hr(idx.t().contiguous()).transpose(0, 1)
    gut = to_hr(gu.transpose(1, 2).contiguous()).transpose(1, 2)
    dnt = to_hr(dn.transpose(1, 2).contiguous()).transpose(1, 2)
    out_buf = hubrt.ops.fill([7, 64], 0.0)
    out = out_buf.narrow(1, 0, 32)
    hubrt.ops.experts(wide, wt, it, gut, dnt, out=out)
    assert_close(out, want, **tol("f32", 32))


@pytest.mark.parametrize("rows", [6, 2])
def test_on_xla_cpu(rows):
    """6 rows x 3 slots over 8 experts: the dense lowering; 2 rows (6 slots
    < 8 experts): each slot's expert gathered."""
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    for dtype, bias, act in [("f32", False, "silu"), ("f32", True, "gelu_tanh"), ("bf16", False, "silu"),
                             ("bf16", True, "gelu_tanh")]:
        x, w, idx, gu, dn, bgu, bdn = case(rows, 32, 16, 8, 3, seed=17, bias=bias)
        idx = idx.clone()
        idx[1, 2] = 8  # a sentinel
        td = TORCH_DTYPE[dtype]
        ins = [to_hr(t.to(td)).to("xla_cpu") if t is not None else None for t in (x, w, gu, dn, bgu, bdn)]
        got = hubrt.ops.experts(ins[0], ins[1], to_hr(idx).to("xla_cpu"), ins[2], ins[3], ins[4], ins[5], act=act)
        assert got.device == "xla_cpu:0"
        ref = run(x, w, idx, gu, dn, bgu, bdn, dtype=dtype, act=act)
        assert_close(got.to("cpu"), to_torch(ref).float(), dtype=dtype, **tol(dtype, 32))


def test_bad_input():
    x, w, idx, gu, dn, _, _ = case(4, 32, 16, 8, 2)
    hx, hw, hi, hg, hd = (to_hr(t) for t in (x, w, idx, gu, dn))
    with pytest.raises(HubrtError, match=r"input 4 \(down\) is \[8, 32, 15\], expected \[8, 32, 16\]"):
        hubrt.ops.experts(hx, hw, hi, hg, to_hr(dn[:, :, :15]))
    with pytest.raises(HubrtError, match=r"input 2 \(indices\) must be i64 or i32"):
        hubrt.ops.experts(hx, hw, to_hr(idx.float()), hg, hd)
    with pytest.raises(HubrtError, match=r"input 3 \(gate_up\) must be \[experts, 2 x intermediate, hidden\]"):
        hubrt.ops.experts(hx, hw, hi, to_hr(gu[:, :31]), hd)
    with pytest.raises(HubrtError, match=r"input 3 \(gate_up\) is bf16 but x is f32"):
        hubrt.ops.experts(hx, hw, hi, to_hr(gu.bfloat16()), hd)
    with pytest.raises(HubrtError, match=r"input 2 \(indices\) is \[4, 3\], expected \[4, 2\]"):
        hubrt.ops.experts(hx, hw, to_hr(torch.zeros(4, 3, dtype=torch.long)), hg, hd)
    with pytest.raises(HubrtError, match=r"unknown act 5"):
        hubrt.ops.call("experts", hx, hw, hi, hg, hd, act=5)
    with pytest.raises(HubrtError, match=r"both biases"):
        hubrt.ops.call("experts", hx, hw, hi, hg, hd, to_hr(torch.zeros(8, 32)))


def gpt_oss_loop(x, w, idx, gu_t, bgu, dn_t, bdn, limit, alpha):
    """transformers' GptOssExperts.forward on its own layout: gate_up [E, H, 2I]
    with gate and up interleaved (::2, 1::2), down [E, I, H], biases."""
    e = gu_t.shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(idx, num_classes=e).permute(2, 1, 0)
    for ex in range(e):
        pos, tok = torch.where(mask[ex])
        if tok.numel() == 0:
            continue
        gate_up = x[tok] @ gu_t[ex] + bgu[ex]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        y = ((up + 1) * (gate * torch.sigmoid(gate * alpha))) @ dn_t[ex] + bdn[ex]
        out.index_add_(0, tok, y * w[tok, pos, None])
    return out


def to_op_layout(gu_t, bgu, dn_t):
    """gpt-oss's layout as the op takes it: gate rows, then up rows; down [E, H, I]."""
    gu = torch.cat([gu_t[..., ::2], gu_t[..., 1::2]], -1).transpose(1, 2).contiguous()
    return gu, torch.cat([bgu[..., ::2], bgu[..., 1::2]], -1), dn_t.transpose(1, 2).contiguous()


@pytest.mark.parametrize("limit", [7.0, 0.5])
def test_gpt_oss_act_against_transformers_loop(limit):
    """limit 0.5 clamps most gates and ups, 7 (gpt-oss's) few."""
    t, h, i, e, k = 11, 64, 24, 8, 4
    check_gpt_oss_act(t, h, i, e, k, limit)
    check_gpt_oss_act(1, h, i, e, k, limit)  # 4 slots < 8 experts: gathered on xla_cpu


def check_gpt_oss_act(t, h, i, e, k, limit):
    x = rand(t, h, seed=21)
    gu_t, dn_t = rand(e, h, 2 * i, seed=22, scale=2 / math.sqrt(h)), rand(e, i, h, seed=23, scale=1 / math.sqrt(i))
    bgu, bdn = rand(e, 2 * i, seed=24, scale=0.5), rand(e, h, seed=25, scale=0.5)
    w, idx = torch.topk(rand(t, e, seed=26), k, -1)
    w = torch.softmax(w, -1)
    want = gpt_oss_loop(x, w, idx, gu_t, bgu, dn_t, bdn, limit, 1.702)
    gu, bgu2, dn = to_op_layout(gu_t, bgu, dn_t)
    got = run(x, w, idx, gu, dn, bgu2, bdn, act="gpt_oss", limit=limit, alpha=1.702)
    assert_close(got, want, **tol("f32", h))
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except HubrtError:
        return
    dev = [to_hr(v).to("xla_cpu") for v in (x, w, idx, gu, dn, bgu2, bdn)]
    on_xla = hubrt.ops.experts(*dev, act="gpt_oss", limit=limit, alpha=1.702)
    assert_close(on_xla.to("cpu"), want, **tol("f32", h))


def test_gpt_oss_act_needs_a_limit():
    x, w, idx, gu, dn, _, _ = case(4, 32, 16, 8, 2)
    with pytest.raises(HubrtError, match=r"gpt_oss needs a finite limit > 0"):
        run(x, w, idx, gu, dn, act="gpt_oss", limit=0.0, alpha=1.702)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_batch_invariant_rows_equal_their_own_call(dtype, isa):  # noqa: F811
    """batch_invariant (what the forward sets for hubrt serve
    --deterministic's steps): each row's bits are what it gets alone,
    whatever other rows share its experts; without it, f32 products of an
    expert with over 16 rows take the tiled GEMM instead of the GEMV, and
    the row's bits change with the batch."""
    x, w, idx, gu, dn, _, _ = case(40, 256, 64, 8, 4, seed=31)
    idx[:, 0] = 3  # every row shares expert 3: 40 rows there
    td = TORCH_DTYPE[dtype]
    full = run(x, w, idx, gu, dn, dtype=dtype, batch_invariant=True).numpy(raw=True)
    for t in (0, 7, 39):
        alone = run(x[t:t + 1], w[t:t + 1], idx[t:t + 1], gu, dn, dtype=dtype, batch_invariant=True)
        assert np.array_equal(alone.numpy(raw=True)[0], full[t]), t
    if dtype == "f32" and isa != "scalar":
        plain = run(x, w, idx, gu, dn).numpy()
        assert not np.array_equal(run(x[:1], w[:1], idx[:1], gu, dn).numpy()[0], plain[0])
    assert_close(run(x, w, idx, gu, dn, dtype=dtype, batch_invariant=True), torch_loop(
        x.to(td), w.to(td), idx, gu.to(td), dn.to(td)).float(), dtype=dtype, **tol(dtype, 256))
