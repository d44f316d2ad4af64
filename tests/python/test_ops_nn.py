"""nn ops against torch / transformers: rms_norm (LlamaRMSNorm and Gemma's
offset form), add_rms_norm (the decoder layer's residual add then
LlamaRMSNorm), layer_norm, rope_cos_sin (LlamaRotaryEmbedding.forward) and
rope (apply_rotary_pos_emb, partial rotary), over f32/bf16/f16, odd sizes,
broadcasting and non-contiguous inputs and outputs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

import hubrt
from cpu_isa import ISA, isa  # noqa: F401 (fixture)
from hubrt._lib import lib
from oracle import TOL, TORCH_DTYPE, assert_close, to_hr, to_torch

FLOATS = ["f32", "bf16", "f16"]
HIDDEN = [1, 3, 17, 4097]


def rand(shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(TORCH_DTYPE[dtype])


def transposed(t):
    """(torch, hubrt) views of t's values whose first and last dims are
    swapped in memory: strided along the normalized dim."""
    base = t.transpose(0, -1).contiguous()
    return base.transpose(0, -1), to_hr(base).transpose(0, -1)


def hr_out(shape, dtype):
    """A destination view taking every other element of a wider buffer."""
    base = hubrt.from_numpy(np.zeros(list(shape[:-1]) + [2 * shape[-1]], np.float32), dtype=dtype)
    return base.slice(-1, 0, None, 2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", HIDDEN)
def test_rms_norm_matches_llama_rmsnorm(dtype, h):
    x = rand((3, 5, h), dtype, scale=3.0)
    m = LlamaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
    m.weight.data = rand((h,), dtype, seed=1)
    got = hubrt.ops.rms_norm(to_hr(x), to_hr(m.weight.data), eps=1e-6)
    want = m(x)
    assert_close(got, want)
    if dtype != "f32":
        # x rounded to its dtype before the weight, as transformers does: bit
        # for bit, but where the f32 sums of squares (summed in another order)
        # put a product on the other side of a rounding boundary
        assert (to_torch(got) != want).float().mean() < 0.01


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", [3, 4097])
def test_rms_norm_gemma_offset_and_no_weight(dtype, h):
    x = rand((4, h), dtype)
    m = GemmaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
    m.weight.data = rand((h,), dtype, seed=2) * 0.1
    got = hubrt.ops.rms_norm(to_hr(x), to_hr(m.weight.data), eps=1e-6, weight_offset=1.0)
    assert_close(got, m(x))
    plain = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    assert_close(hubrt.ops.rms_norm(to_hr(x), eps=1e-5), plain.to(x.dtype))


def test_rms_norm_strided_in_out_and_mixed_weight():
    x = rand((17, 6, 64), "f32")
    xt, xh = transposed(x)
    w = rand((64,), "f32", seed=3)
    wide = to_hr(torch.stack([w, w], -1)).select(-1, 0)  # weight with stride 2
    out = hr_out((17, 6, 64), "f32")
    hubrt.ops.call("rms_norm", xh, wide, out=out, eps=1e-6, weight_offset=0.0)
    ref = LlamaRMSNorm(64, eps=1e-6)
    ref.weight.data = w
    assert_close(out, ref(xt))
    # bf16 activations with an f32 weight: normalized in f32, rounded to bf16, times weight
    xb = x.to(torch.bfloat16)
    want = (w * (xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16))
    assert_close(hubrt.ops.rms_norm(to_hr(xb), to_hr(w), eps=1e-6), want.to(torch.bfloat16))


def residual_then_norm(x, residual, norm):
    """The decoder layer's step in transformers: the residual add in the
    activations' dtype, then the norm of that sum."""
    total = residual + x
    return norm(total), total


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", HIDDEN)
def test_add_rms_norm_matches_residual_then_llama_rmsnorm(dtype, h, isa):
    x, res = rand((3, 5, h), dtype, scale=3.0), rand((3, 5, h), dtype, seed=1, scale=2.0)
    m = LlamaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
    m.weight.data = rand((h,), dtype, seed=2)
    got_y, got_sum = hubrt.ops.add_rms_norm(to_hr(x), to_hr(res), to_hr(m.weight.data), eps=1e-6)
    want_y, want_sum = residual_then_norm(x, res, m)
    assert torch.equal(to_torch(got_sum), want_sum)  # torch's add rounds once, as the kernel
    assert_close(got_y, want_y)
    if dtype != "f32":
        # bit for bit but where the sum of squares (summed in another order)
        # moves a product across a rounding boundary, as for rms_norm
        assert (to_torch(got_y) != want_y).float().mean() < 0.01
    # the unfused ops of hubrt agree with the fused one (bit for bit off AVX-512)
    unfused = hubrt.ops.rms_norm(hubrt.ops.add(to_hr(x), to_hr(res)), to_hr(m.weight.data), eps=1e-6)
    if isa != "avx512" or dtype != "bf16":
        assert torch.equal(to_torch(got_y), to_torch(unfused))


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_rms_norm_offset_no_weight_and_specials(dtype, isa):
    h = 4097
    x, res = rand((2, h), dtype), rand((2, h), dtype, seed=3)
    x[0, 5], res[1, 7], x[1, 9], res[1, 9] = float("nan"), float("inf"), 1e4, -1e4
    m = GemmaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
    m.weight.data = rand((h,), dtype, seed=4) * 0.1
    got_y, got_sum = hubrt.ops.add_rms_norm(to_hr(x), to_hr(res), to_hr(m.weight.data), eps=1e-6,
                                            weight_offset=1.0)
    want_y, want_sum = residual_then_norm(x, res, m)
    assert_close(got_sum, want_sum, atol=0, rtol=0)  # nan and inf kept where torch keeps them
    assert_close(got_y, want_y)
    plain = lambda t: (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(t.dtype)
    got_y, _ = hubrt.ops.add_rms_norm(to_hr(x[:, :17]), to_hr(res[:, :17]), eps=1e-5)
    assert_close(got_y, residual_then_norm(x[:, :17], res[:, :17], plain)[0])


def test_add_rms_norm_strided_and_in_place(isa):
    # x strided along the normalized dim, residual a column slice, weight with stride 2
    x = rand((17, 6, 64), "bf16", scale=2.0)
    xt, xh = transposed(x)
    wide_res = rand((17, 6, 128), "bf16", seed=5)
    res_t, res_h = wide_res[..., 32:96], to_hr(wide_res).slice(-1, 32, 96)
    w = rand((64,), "bf16", seed=6)
    w_h = to_hr(torch.stack([w, w], -1)).select(-1, 0)
    y_out, sum_out = hr_out((17, 6, 64), "bf16"), hr_out((17, 6, 64), "bf16")
    hubrt.ops.add_rms_norm(xh, res_h, w_h, eps=1e-6, out=(y_out, sum_out))
    ref = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    ref.weight.data = w
    want_y, want_sum = residual_then_norm(xt, res_t, ref)
    assert torch.equal(to_torch(sum_out), want_sum)
    assert_close(y_out, want_y)
    # in place as the decoder layers run it: the sum over the residual, the
    # normed rows over x (both contiguous here, so the AVX-512 row runs)
    xc, rc = to_hr(x), to_hr(wide_res[..., :64])
    hubrt.ops.add_rms_norm(xc, rc, to_hr(w), eps=1e-6, out=(xc, rc))
    want_y, want_sum = residual_then_norm(x, wide_res[..., :64], ref)
    assert torch.equal(to_torch(rc), want_sum)
    assert_close(xc, want_y)
    # f32 weight on bf16 activations: normalized, rounded to bf16, times the f32 weight
    got_y, _ = hubrt.ops.add_rms_norm(to_hr(x), to_hr(x), to_hr(w.float()), eps=1e-6)
    s2 = x + x
    want = w.float() * (s2.float() * torch.rsqrt(s2.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert_close(got_y, want.to(torch.bfloat16))


def test_add_rms_norm_errors_name_op_and_input():
    x = to_hr(torch.zeros(2, 8))
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm': residual \[2, 7\] f32 must have the shape "
                                               r"and dtype of x \[2, 8\] f32"):
        hubrt.ops.add_rms_norm(x, to_hr(torch.zeros(2, 7)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm': residual \[2, 8\] bf16 must have"):
        hubrt.ops.add_rms_norm(x, to_hr(torch.zeros(2, 8, dtype=torch.bfloat16)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm'.*residual must be f32, bf16 or f16, got i64"):
        hubrt.ops.add_rms_norm(x, to_hr(torch.zeros(2, 8, dtype=torch.int64)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm'.*x must be f32, bf16 or f16, got i32"):
        hubrt.ops.add_rms_norm(to_hr(torch.zeros(2, 8, dtype=torch.int32)), x)
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm': weight shape \[7\] != \[8\]"):
        hubrt.ops.add_rms_norm(x, x, to_hr(torch.zeros(7)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'add_rms_norm': output 1 is \[2, 4\] f32 but the result is"):
        hubrt.ops.add_rms_norm(x, x, out=(None, to_hr(torch.zeros(2, 4))))
    got_y, got_sum = hubrt.ops.add_rms_norm(to_hr(torch.zeros(0, 8)), to_hr(torch.zeros(0, 8)))
    assert got_y.shape == (0, 8) and got_sum.shape == (0, 8)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", HIDDEN)
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm(dtype, h, affine):
    x = rand((2, 3, h), dtype, scale=2.0) + 0.5
    w = rand((h,), dtype, seed=4) if affine != "none" else None
    b = rand((h,), dtype, seed=5) if affine == "both" else None
    got = hubrt.ops.layer_norm(to_hr(x), to_hr(w) if w is not None else None,
                               to_hr(b) if b is not None else None, eps=1e-5)
    want = F.layer_norm(x.float(), (h,), None if w is None else w.float(), None if b is None else b.float(), 1e-5)
    assert_close(got, want.to(x.dtype))


def test_layer_norm_strided():
    x = rand((33, 4, 17), "f32")
    xt, xh = transposed(x)
    w, b = rand((17,), "f32", seed=6), rand((17,), "f32", seed=7)
    out = hr_out((33, 4, 17), "f32")
    hubrt.ops.call("layer_norm", xh, to_hr(w), to_hr(b), out=out, eps=1e-5, weight_offset=0.0)
    assert_close(out, F.layer_norm(xt, (17,), w, b, 1e-5))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("scaling", [1.0, 0.75])
def test_rope_cos_sin_matches_rotary_embedding(dtype, scaling):
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=4096)
    emb = LlamaRotaryEmbedding(cfg)
    emb.attention_scaling = scaling
    pos = torch.tensor([[0, 1, 2, 17, 4096], [5, 6, 1000, 3000, 70000]])
    cos, sin = emb(torch.zeros(1, dtype=TORCH_DTYPE[dtype]), pos)
    hc, hs = hubrt.ops.rope_cos_sin(to_hr(pos), to_hr(emb.inv_freq), scaling, dtype=dtype)
    assert hc.shape == (2, 5, 64) and hc.dtype == dtype
    # the same f32 angles; torch's cos/sin are within 1 ulp of the correctly rounded ones
    tol = dict(atol=1.2e-7, rtol=0) if dtype == "f32" else dict(atol=TOL[dtype][0], rtol=0)
    torch.testing.assert_close(to_torch(hc).float(), cos.float(), **tol)
    torch.testing.assert_close(to_torch(hs).float(), sin.float(), **tol)


def test_rope_cos_sin_strided_positions_i32_and_outputs():
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    base = torch.arange(40, dtype=torch.int32).reshape(4, 10)
    pos_h = to_hr(base).slice(1, 0, None, 3)  # [4, 4], stride 3
    pos_t = base[:, ::3].long()
    co, so = hr_out((4, 4, 16), "bf16"), hr_out((4, 4, 16), "bf16")
    hubrt.ops.call("rope_cos_sin", pos_h, to_hr(inv), out=(co, so), attention_scaling=0.0, dtype="bf16")
    freqs = pos_t[..., None].float() * inv
    emb = torch.cat([freqs, freqs], -1)
    assert_close(co, emb.cos().to(torch.bfloat16))
    assert_close(so, emb.sin().to(torch.bfloat16))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("head_dim,rot", [(64, 64), (64, 32), (80, 40), (6, 2)])
def test_rope_matches_apply_rotary_pos_emb(dtype, head_dim, rot):
    b, h, s = 2, 3, 17
    q = rand((b, h, s, head_dim), dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    freqs = torch.arange(s)[None, :, None].float() * inv
    emb = torch.cat([freqs, freqs], -1).expand(b, s, rot)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
    q_rot, q_pass = q[..., :rot], q[..., rot:]
    want, _ = apply_rotary_pos_emb(q_rot, q_rot, cos, sin)
    want = torch.cat([want, q_pass], -1)
    got = hubrt.ops.rope(to_hr(q), to_hr(cos).unsqueeze(1), to_hr(sin).unsqueeze(1))
    assert torch.equal(to_torch(got), want)  # same roundings as transformers


def test_rope_strided_q_inplace_and_f32_tables_on_bf16():
    b, s, h, d = 1, 4097, 2, 16
    # q as the attention code makes it: [b, s, h, d] viewed as [b, h, s, d]
    q = rand((b, s, h, d), "bf16")
    qt = q.transpose(1, 2)
    qh = to_hr(q).transpose(1, 2)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.arange(s)[None, :, None].float() * inv
    emb = torch.cat([freqs, freqs], -1)
    cos32, sin32 = emb.cos(), emb.sin()
    # f32 tables on bf16 q: torch promotes the products to f32, then rounds
    want = (qt * cos32[:, None] + torch.cat([-qt[..., d // 2:], qt[..., :d // 2]], -1) * sin32[:, None])
    got = hubrt.ops.rope(qh, to_hr(cos32).unsqueeze(1), to_hr(sin32).unsqueeze(1))
    assert_close(got, want.to(torch.bfloat16), atol=0, rtol=0)
    # in place: the output is q's own (strided) storage
    hubrt.ops.call("rope", qh, to_hr(cos32).unsqueeze(1), to_hr(sin32).unsqueeze(1), out=qh)
    assert_close(qh, want.to(torch.bfloat16), atol=0, rtol=0)


def test_nn_errors_name_op_and_input():
    x = to_hr(torch.zeros(2, 8))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rms_norm': weight shape \[7\] != \[8\], the last dim of x"):
        hubrt.ops.rms_norm(x, to_hr(torch.zeros(7)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'layer_norm': bias shape \[2, 8\] != \[8\]"):
        hubrt.ops.layer_norm(x, to_hr(torch.zeros(8)), to_hr(torch.zeros(2, 8)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rms_norm'.*x must be f32, bf16 or f16, got i64"):
        hubrt.ops.rms_norm(to_hr(torch.zeros(2, 8, dtype=torch.int64)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope_cos_sin'.*positions must be i64 or i32, got f32"):
        hubrt.ops.rope_cos_sin(to_hr(torch.zeros(3)), to_hr(torch.ones(4)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope_cos_sin'.*attrs.dtype must be f32, bf16 or f16, got i64"):
        hubrt.ops.rope_cos_sin(to_hr(torch.zeros(3, dtype=torch.int64)), to_hr(torch.ones(4)), dtype="i64")
    cs = to_hr(torch.zeros(2, 10))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope': cos \[2, 10\]: the rotary dim 10 must be .* <= the last"):
        hubrt.ops.rope(x, cs, cs)
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope': cos \[2, 4\] f32 and sin \[2, 6\] f32 must match"):
        hubrt.ops.rope(x, to_hr(torch.zeros(2, 4)), to_hr(torch.zeros(2, 6)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope'.*do not broadcast"):
        hubrt.ops.rope(x, to_hr(torch.zeros(3, 4)), to_hr(torch.zeros(3, 4)))
    with pytest.raises(hubrt.HubrtError, match=r"op 'rope': cos \[4, 2, 4\] does not broadcast to x\[\.\.\., :4\]"):
        hubrt.ops.rope(x, to_hr(torch.zeros(4, 2, 4)), to_hr(torch.zeros(4, 2, 4)))


# ---- every ISA gives the portable path's bytes ------------------------------


def sprinkle(t, seed=7):
    """t (contiguous) with subnormals of its dtype, signed zeros, infs and a
    NaN written over an eighth of its elements, in place: the AVX-512 rows
    redo any block that rounds a subnormal with the AVX2 code."""
    flat = t.view(-1)
    idx = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(seed))[: max(flat.numel() // 8, 1)]
    tiny = [1e-39, -3e-39, 5e-41] if t.dtype != torch.float16 else [3e-6, -1e-7, 6e-8]
    vals = torch.tensor(tiny + [0.0, -0.0, 1e-30, float("inf"), float("nan")]).to(t.dtype)
    flat[idx] = vals[torch.arange(idx.numel()) % len(vals)]
    return t


def bits(x):
    """x's bits, every NaN as one value: which NaN an operation on two
    operands returns depends on their order, which the compiler may choose
    for the portable code (it differs at -O0)."""
    t = to_torch(x)
    b = t.view(torch.int32 if t.dtype == torch.float32 else torch.int16).clone()
    b[t.isnan()] = -1
    return b


def same_bytes_as_scalar(fn, isa):
    """fn() under the test's ISA and under the portable (scalar) one: the
    same bytes (NaNs aside)."""
    got = fn()
    assert lib.hr_cpu_isa_set(ISA["scalar"]) == 0
    try:
        want = fn()
    finally:
        assert lib.hr_cpu_isa_set(ISA[isa]) == 0
    assert torch.equal(bits(got), bits(want))
    return got


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("head_dim", [128, 34, 6])
def test_rope_same_bytes_under_every_isa(dtype, head_dim, isa):
    b, s, h = 2, 17, 3
    q = sprinkle(rand((b, s, h, head_dim), dtype))
    # cos/sin with subnormal products: tiny entries times q's normal values
    cos, sin = sprinkle(rand((b, s, head_dim), dtype), 8), sprinkle(rand((b, s, head_dim), dtype), 9)
    qh = to_hr(q).transpose(1, 2)  # [b, h, s, d] as the attention code views it
    ch, sh = to_hr(cos).unsqueeze(1), to_hr(sin).unsqueeze(1)
    got = same_bytes_as_scalar(lambda: hubrt.ops.rope(qh, ch, sh), isa)
    want, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), cos, sin)
    assert_close(got, want, atol=0, rtol=0)
    # in place, into a strided cache slice, gives the same bytes
    cache = to_hr(torch.zeros(b, h, s + 5, head_dim, dtype=TORCH_DTYPE[dtype])).slice(2, 2, 2 + s)
    hubrt.ops.call("rope", qh, ch, sh, out=cache)
    assert torch.equal(bits(cache), bits(got))
    hubrt.ops.call("rope", qh, ch, sh, out=qh)
    assert torch.equal(bits(qh), bits(got))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", [1, 17, 128, 4097])
@pytest.mark.parametrize("weight", ["same", "f32", "none", "offset"])
def test_rms_norm_same_bytes_under_every_isa(dtype, h, weight, isa):
    x = rand((5, 3, h), dtype, scale=3.0)
    x[0] = sprinkle(x[0].contiguous())
    x[1, :, ::3] = 1e-39 if dtype != "f16" else 1e-7  # subnormal outputs in otherwise normal rows
    w = rand((h,), dtype if weight != "f32" else "f32", seed=1)
    w[::5] = 1e-38 if dtype != "f16" else 1e-4  # subnormal products
    args = () if weight == "none" else (to_hr(w),)
    offset = 1.0 if weight == "offset" else 0.0
    got = same_bytes_as_scalar(lambda: hubrt.ops.rms_norm(to_hr(x), *args, eps=1e-6, weight_offset=offset), isa)
    if weight == "same":
        m = LlamaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
        m.weight.data = w
        assert_close(got, m(x))
    # a strided destination takes the same bytes
    out = hr_out((5, 3, h), dtype)
    hubrt.ops.call("rms_norm", to_hr(x), *args, out=out, eps=1e-6, weight_offset=offset)
    assert torch.equal(bits(out), bits(got))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("h", [1, 17, 128, 4097])
@pytest.mark.parametrize("weight", ["same", "f32", "none", "offset"])
def test_add_rms_norm_same_bytes_under_every_isa(dtype, h, weight, isa):
    # small integers whose squares sum exactly in any order (the AVX-512 bf16
    # row sums them in another), subnormals whose squares are 0, and a
    # weight with subnormal products
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-8, 9, (4, 3, h), generator=g).to(TORCH_DTYPE[dtype])
    res = torch.randint(-8, 9, (4, 3, h), generator=g).to(TORCH_DTYPE[dtype])
    tiny = 1e-39 if dtype != "f16" else 1e-7
    x[1, :, ::3], res[1, :, ::3] = tiny, 0.0
    x[2, 0, ::2] = -0.0
    res[2, 0, ::2] = 0.0
    w = rand((h,), dtype if weight != "f32" else "f32", seed=1)
    w[::5] = 1e-38 if dtype != "f16" else 1e-4
    args = () if weight == "none" else (to_hr(w),)
    offset = 1.0 if weight == "offset" else 0.0

    def run():
        y, s = hubrt.ops.add_rms_norm(to_hr(x), to_hr(res), *args, eps=1e-6, weight_offset=offset)
        return hubrt.ops.cat([y, s], 0)

    got = same_bytes_as_scalar(run, isa)
    if weight == "same":
        m = LlamaRMSNorm(h, eps=1e-6).to(TORCH_DTYPE[dtype])
        m.weight.data = w
        want_y, want_sum = residual_then_norm(x, res, m)
        assert_close(got, torch.cat([want_y, want_sum], 0))
