"""sdpa against F.scaled_dot_product_attention (enable_gqa, explicit masks)
and, for what torch's op lacks (bottom-right causal with s < t, sliding
window, softcap, zeros for fully masked rows), an explicit torch reference."""

import pytest
import torch
import torch.nn.functional as F

import hubrt
from cpu_isa import isa  # noqa: F401 (fixture)
from hubrt._lib import lib
from oracle import TORCH_DTYPE, assert_close, to_hr, to_torch

DTYPES = ["f32", "bf16", "f16"]


def rand(*shape, dtype="f32", seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + sum(shape))
    return torch.randn(*shape, generator=g).to(TORCH_DTYPE[dtype])


def qkv(b, hq, hkv, s, t, d, dv=None, dtype="f32"):
    return (rand(b, hq, s, d, dtype=dtype, seed=1), rand(b, hkv, t, d, dtype=dtype, seed=2),
            rand(b, hkv, t, dv or d, dtype=dtype, seed=3))


def reference(q, k, v, mask=None, scale=None, causal=False, window=0, softcap=0.0):
    """Attention in f32 with hubrt's conventions: query i at position
    t - s + i, window keeps pos_q - pos_k < window, softcap before masks,
    fully masked rows give zeros."""
    q, k, v = q.float(), k.float(), v.float()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s, t = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    keep = torch.ones(s, t, dtype=torch.bool)
    pq = torch.arange(s)[:, None] + t - s
    pk = torch.arange(t)[None, :]
    if causal:
        keep &= pk <= pq
    if window:
        keep &= pq - pk < window
    if mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        scores = scores + mask.float()
    scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return p @ v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (7, 1)])
@pytest.mark.parametrize("d", [64, 80, 128])
def test_sdpa_gqa(dtype, hq, hkv, d):
    q, k, v = qkv(2, hq, hkv, 5, 9, d, dtype=dtype)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v)), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_decode_over_cache(isa, dtype):
    """s = 1 over t = 37: causal alignment lets the one query see every key."""
    q, k, v = qkv(1, 8, 2, 1, 37, 64, dtype=dtype)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(4, 2), (7, 1)])
def test_sdpa_causal_prefill(isa, dtype, hq, hkv):
    """s = t spanning several query and key blocks (with 7 heads per kv head
    a block boundary falls between the heads of one query): torch's own
    is_causal."""
    q, k, v = qkv(1, hq, hkv, 70, 70, 80, dtype=dtype)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), want)


@pytest.mark.parametrize("s,t", [(5, 37), (3, 4097), (66, 130)])
def test_sdpa_causal_shorter_queries(s, t):
    """s < t: bottom-right causal, checked against torch with an explicit mask."""
    q, k, v = qkv(1, 2, 1, s, t, 64)
    keep = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + t - s
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), want, atol=2e-5)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("s,t,window", [(100, 100, 16), (1, 37, 5), (10, 90, 33)])
def test_sdpa_sliding_window(isa, dtype, s, t, window):
    q, k, v = qkv(1, 6, 2, s, t, 64, dtype=dtype)
    want = reference(q, k, v, causal=True, window=window)
    keep = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + t - s
    keep &= torch.arange(s)[:, None] + t - s - torch.arange(t)[None, :] < window
    torch.testing.assert_close(want, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep,
                                                                    enable_gqa=True))
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True, window=window), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "additive_same", "additive_f32"])
def test_sdpa_masks(dtype, kind):
    """Padding-style [b, 1, 1, t] and full [b, hq, s, t] masks."""
    b, hq, s, t = 2, 4, 6, 11
    q, k, v = qkv(b, hq, 2, s, t, 64, dtype=dtype)
    pad = torch.ones(b, 1, 1, t, dtype=torch.bool)
    pad[0, ..., :3] = False  # left padding in batch 0
    full = torch.rand(b, hq, s, t, generator=torch.Generator().manual_seed(5)) > 0.3
    full[..., -1] = True  # keep each row attending somewhere for torch
    for keep in (pad, full):
        if kind == "bool":
            mask, hr_mask = keep, to_hr(keep)
        else:
            add = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
            add = add + rand(*keep.shape, seed=6) * keep
            add = add.to(TORCH_DTYPE[dtype] if kind == "additive_same" else torch.float32)
            mask, hr_mask = add.float(), to_hr(add)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
        assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), hr_mask), want)


def test_sdpa_mask_2d_with_causal_and_scale():
    q, k, v = qkv(1, 2, 2, 4, 9, 64)
    add = rand(4, 9, seed=9)
    want = reference(q, k, v, mask=add, scale=0.3, causal=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(add), scale=0.3, is_causal=True), want)


def test_sdpa_fully_masked_rows_are_zero():
    q, k, v = qkv(1, 2, 1, 3, 5, 64)
    keep = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    keep[..., 1, :] = False
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep))
    want = reference(q, k, v, mask=keep)
    assert torch.all(want[:, :, 1] == 0)
    assert_close(got, want)
    # queries before the first key (s > t, causal) see nothing either
    q2 = rand(1, 2, 7, 64, seed=4)
    assert_close(hubrt.ops.sdpa(to_hr(q2), to_hr(k), to_hr(v), is_causal=True),
                 reference(q2, k, v, causal=True))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sdpa_softcap(isa, dtype):
    q, k, v = qkv(1, 4, 2, 8, 8, 64, dtype=dtype)
    q = q * 4  # large scores, so the cap matters
    want = reference(q, k, v, causal=True, softcap=5.0, scale=0.25)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True, softcap=5.0, scale=0.25), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_strided_views(dtype):
    """q in the HF [b, s, h, d] layout transposed; k/v narrowed out of a static
    cache [b, hkv, max_len, d]; the output written into a transposed view."""
    b, hq, hkv, s, t, d, max_len = 2, 4, 2, 3, 37, 64, 50
    q_bshd = rand(b, s, hq, d, dtype=dtype, seed=1)
    cache_k, cache_v = rand(b, hkv, max_len, d, dtype=dtype, seed=2), rand(b, hkv, max_len, d, dtype=dtype, seed=3)
    q = q_bshd.transpose(1, 2)
    k, v = cache_k[:, :, :t], cache_v[:, :, :t]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    hq_ = to_hr(q_bshd).transpose(1, 2)
    hk, hv = to_hr(cache_k).narrow(2, 0, t), to_hr(cache_v).narrow(2, 0, t)
    assert not hq_.is_contiguous() and not hk.is_contiguous()
    assert_close(hubrt.ops.sdpa(hq_, hk, hv), want)
    out_bshd = to_hr(torch.zeros(b, s, hq, d, dtype=TORCH_DTYPE[dtype]))
    hubrt.ops.call("sdpa", hq_, hk, hv, out=out_bshd.transpose(1, 2))
    assert_close(out_bshd, want.transpose(1, 2))


# decode-sized, and in query blocks (each V panel's last run of 16 features partly padded)
@pytest.mark.parametrize("s,t", [(4, 6), (40, 70)])
def test_sdpa_value_dim_differs(s, t):
    q, k, v = qkv(1, 2, 1, s, t, 64, dv=40)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert_close(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v)), want)


def test_sdpa_errors():
    q, k, v = (to_hr(x) for x in qkv(1, 4, 2, 3, 5, 8))
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*q.*4-d"):
        hubrt.ops.sdpa(to_hr(rand(4, 3, 8)), k, v)
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*multiple"):
        hubrt.ops.sdpa(to_hr(rand(1, 3, 3, 8)), k, v)
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*head_dim"):
        hubrt.ops.sdpa(to_hr(rand(1, 4, 3, 9)), k, v)
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*v.*bf16"):
        hubrt.ops.sdpa(q, k, to_hr(rand(1, 2, 5, 8, dtype="bf16")))
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*mask.*broadcast"):
        hubrt.ops.sdpa(q, k, v, to_hr(rand(3, 4)))
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*mask.*i64"):
        hubrt.ops.sdpa(q, k, v, to_hr(torch.ones(3, 5, dtype=torch.int64)))
    with pytest.raises(hubrt.HubrtError, match=r"sdpa.*window"):
        hubrt.ops.sdpa(q, k, v, window=-1)


def test_sdpa_feature_strides_and_strided_mask(isa):
    """head_dim strided (every other element of a wider buffer) for q, k and
    v, and an additive mask read through a transposed view."""
    q, k, v = qkv(1, 4, 2, 5, 19, 64)

    def every_other(x):
        return to_hr(torch.stack([x, torch.zeros_like(x)], dim=-1).flatten(-2)).slice(3, 0, None, 2)

    add = rand(1, 4, 19, 5, seed=8)  # stored [.., t, s]: the [.., s, t] view is transposed
    hm = to_hr(add).transpose(2, 3)
    assert not hm.is_contiguous()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=add.transpose(2, 3), enable_gqa=True)
    assert_close(hubrt.ops.sdpa(every_other(q), every_other(k), every_other(v), hm), want, atol=2e-5)


# ---- bf16 on the AVX-512 BF16 paths (flash prefill with P in bf16, decode on
# vdpbf16ps): also run under avx2/scalar by the isa fixture. P rounded to bf16
# adds error, so each case also checks that hubrt's error against an f32
# reference stays within twice torch's own bf16 SDPA error on the same inputs.

def check_bf16(got, q, k, v, mask=None, causal=False, **kw):
    """hubrt's bf16 result against the f32 reference of the same bf16
    inputs: within the bf16 tolerance, and (where torch's op expresses the
    case) within 2x torch's bf16 SDPA error."""
    want = reference(q, k, v, mask=mask, causal=causal, **kw)
    assert_close(got, want)
    if kw:
        return
    s, t = q.shape[2], k.shape[2]
    keep = mask
    if causal:
        keep = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + t - s
        keep = keep if mask is None else keep & mask
    if keep is not None and keep.dtype == torch.bool and not keep.any(-1).all():
        return  # torch gives NaN for rows that see no key
    mine = (to_torch(got).float() - want).abs().max().item()
    torch_bf16 = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    theirs = (torch_bf16.float() - want).abs().max().item()
    assert mine <= 2 * theirs + 1e-3, (mine, theirs)


def check_any(got, q, k, v, dtype, atol=None, mask=None, **kw):
    """check_bf16 for bf16; f32 and f16 within their tolerance (atol when
    given) of torch's SDPA where it expresses the case (a mask alone), else
    of the f32 reference."""
    if dtype == "bf16":
        check_bf16(got, q, k, v, mask=mask, **kw)
        return
    if mask is None or kw:
        want = reference(q, k, v, mask=mask, **kw)
    else:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_close(got, want, atol=atol)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s,t,hq,hkv", [(1, 1, 2, 2), (17, 17, 4, 2), (63, 63, 4, 1), (65, 65, 7, 1),
                                        (130, 130, 2, 1), (257, 257, 2, 2), (63, 300, 4, 2), (300, 300, 8, 2)])
def test_sdpa_bf16_flash_causal(isa, d, s, t, hq, hkv):
    q, k, v = qkv(1, hq, hkv, s, t, d, dtype="bf16")
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), q, k, v, causal=True)


@pytest.mark.parametrize("s,t", [(1, 37), (5, 130), (130, 65), (257, 257)])
def test_sdpa_bf16_flash_full(isa, s, t):
    q, k, v = qkv(2, 4, 2, s, t, 128, dtype="bf16")
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v)), q, k, v)


@pytest.mark.parametrize("d", [32, 96, 256])
@pytest.mark.parametrize("s,t", [(1, 1), (1, 37), (2, 300)])
def test_sdpa_bf16_decode_head_dims(isa, d, s, t):
    """The decode path's Q.K for head dims with their own code (64 and 128
    are above): 256 with the query in eight registers, 32 and 96 through
    the loop over d."""
    q, k, v = qkv(2, 4, 2, s, t, d, dtype="bf16")
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=s > 1), q, k, v, causal=s > 1)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("s,t", [(1, 70), (65, 130)])
def test_sdpa_bf16_masks(isa, kind, s, t):
    """Left padding in batch 0 as [b, 1, 1, t], and a full [b, hq, s, t] mask,
    with causal on top."""
    b, hq, hkv = 2, 4, 2
    q, k, v = qkv(b, hq, hkv, s, t, 64, dtype="bf16")
    pad = torch.ones(b, 1, 1, t, dtype=torch.bool)
    pad[0, ..., :67] = False  # spans a whole key block
    full = torch.rand(b, hq, s, t, generator=torch.Generator().manual_seed(5)) > 0.3
    full[..., -1] = True
    for keep in (pad, full):
        if kind == "bool":
            got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep), is_causal=True)
            check_bf16(got, q, k, v, mask=keep, causal=True)
        else:
            add = torch.zeros(keep.shape).masked_fill(~keep, float("-inf")) + rand(*keep.shape, seed=6) * keep
            got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(add.bfloat16()), is_causal=True)
            assert_close(got, reference(q, k, v, mask=add.bfloat16(), causal=True))


@pytest.mark.parametrize("s,t,window", [(130, 130, 70), (1, 300, 100), (65, 257, 3)])
def test_sdpa_bf16_window_softcap(isa, s, t, window):
    q, k, v = qkv(1, 4, 2, s, t, 128, dtype="bf16")
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True, window=window)
    check_bf16(got, q, k, v, causal=True, window=window)
    q4 = q * 4
    got = hubrt.ops.sdpa(to_hr(q4), to_hr(k), to_hr(v), is_causal=True, softcap=5.0, scale=0.25)
    check_bf16(got, q4, k, v, causal=True, softcap=5.0, scale=0.25)


@pytest.mark.parametrize("s", [1, 70])
def test_sdpa_bf16_model_layout(isa, s):
    """q as the model passes it ([b, s, h, d] transposed), k/v narrowed out of
    a cache, the output into a transposed view."""
    b, hq, hkv, d, t, max_len = 2, 8, 2, 128, 90, 130
    q_bshd = rand(b, s, hq, d, dtype="bf16", seed=1)
    cache_k, cache_v = rand(b, hkv, max_len, d, dtype="bf16", seed=2), rand(b, hkv, max_len, d, dtype="bf16", seed=3)
    q, k, v = q_bshd.transpose(1, 2), cache_k[:, :, :t], cache_v[:, :, :t]
    hk, hv = to_hr(cache_k).narrow(2, 0, t), to_hr(cache_v).narrow(2, 0, t)
    out_bshd = to_hr(torch.zeros(b, s, hq, d, dtype=torch.bfloat16))
    hubrt.ops.call("sdpa", to_hr(q_bshd).transpose(1, 2), hk, hv, out=out_bshd.transpose(1, 2), is_causal=True)
    check_bf16(out_bshd.transpose(1, 2), q, k, v, causal=True)


@pytest.mark.parametrize("t", [1, 48, 300])
@pytest.mark.parametrize("hq", [8, 16, 56])
def test_sdpa_bf16_decode_batch(isa, t, hq):
    """b = 64 decode rows (rep 1, 2, 7 per kv head), one key split and
    several."""
    q, k, v = qkv(64, hq, 8, 1, t, 128, dtype="bf16")
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,kv_layout", [(37, "cache"), (300, "cache"), (37, "bshd"), (300, "bshd"),
                                         (37, "compiled"), (300, "compiled")])
def test_sdpa_decode_model_exact(isa, dtype, t, kv_layout):
    """A batch-64 decode step as the model makes it: q [b, s, hq, d]
    transposed, the output into a transposed view, a bool mask [b, 1, 1, t]
    with left padding of varied lengths, and K/V narrowed out of a cache of
    larger capacity ("cache": rows adjacent, heads capacity apart), read
    from [b, t, hkv, d] transposed ("bshd": rows hkv * d apart), or, as a
    compiled step attends, the whole cache with the mask hiding the slots
    past t ("compiled": whole key blocks and block tails hidden). The
    decode units are claimed one ahead and the K/V read next prefetched,
    skipping hidden keys, so every unit of a large batch and each key
    layout of the prefetch goes through."""
    b, hq, hkv, d = 64, 16, 8, 128
    cap = t + 70 if kv_layout == "compiled" else t + 15
    q_bshd = rand(b, 1, hq, d, dtype=dtype, seed=1)
    if kv_layout == "bshd":
        k_bshd, v_bshd = rand(b, t, hkv, d, dtype=dtype, seed=2), rand(b, t, hkv, d, dtype=dtype, seed=3)
        k, v = k_bshd.transpose(1, 2), v_bshd.transpose(1, 2)
        hk, hv = to_hr(k_bshd).transpose(1, 2), to_hr(v_bshd).transpose(1, 2)
    else:
        cache_k, cache_v = rand(b, hkv, cap, d, dtype=dtype, seed=2), rand(b, hkv, cap, d, dtype=dtype, seed=3)
        n = cap if kv_layout == "compiled" else t
        k, v = cache_k[:, :, :n], cache_v[:, :, :n]
        hk, hv = to_hr(cache_k).narrow(2, 0, n), to_hr(cache_v).narrow(2, 0, n)
    keep = torch.ones(b, 1, 1, k.shape[2], dtype=torch.bool)
    keep[..., t:] = False
    for r in range(0, b, 3):
        keep[r, ..., : (r * 7) % (t - 1)] = False  # left padding; key t - 1 stays
    out_bshd = to_hr(torch.zeros(b, 1, hq, d, dtype=TORCH_DTYPE[dtype]))
    hubrt.ops.call("sdpa", to_hr(q_bshd).transpose(1, 2), hk, hv, to_hr(keep), out=out_bshd.transpose(1, 2))
    q = q_bshd.transpose(1, 2)
    if dtype == "bf16":
        check_bf16(out_bshd.transpose(1, 2), q, k, v, mask=keep)
    else:
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep, enable_gqa=True)
        assert_close(out_bshd.transpose(1, 2), want)


# ---- long prompts: the bf16 prefill runs chunks of up to HR_ATTN_CHUNK (16)
# query blocks of 48 rows key block by key block, its scratch one packed key
# block and the chunk's state; these span many key blocks (4097 keys: a tail
# of 1) and more than one chunk per (batch, kv head) with odd row counts.

@pytest.mark.parametrize("kind", ["causal", "bool"])
def test_sdpa_bf16_long_keys(isa, kind):
    """401 queries (802 GQA rows: 17 query blocks, the last partial, in
    several chunks) at the end of 4097 keys, bottom-right causal, alone or under a
    random bool mask [b, 1, s, t] that hides whole key blocks of some
    rows."""
    b, hq, hkv, s, t, d = 1, 4, 2, 401, 4097, 64
    q, k, v = qkv(b, hq, hkv, s, t, d, dtype="bf16")
    if kind == "causal":
        check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), q, k, v, causal=True)
        return
    keep = torch.rand(b, 1, s, t, generator=torch.Generator().manual_seed(7)) > 0.5
    keep[..., 64:1000] = False  # whole key blocks hidden from every row
    keep[:, :, : s // 2, 1000:3000] = False  # and from the first half of the rows only
    keep[..., t - s:] |= torch.eye(s, dtype=torch.bool)  # each row sees its own key
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep), is_causal=True)
    check_bf16(got, q, k, v, mask=keep, causal=True)


@pytest.mark.parametrize("s,past,cap,hq,hkv,d", [(512, 0, 640, 9, 3, 64), (130, 70, 256, 4, 2, 128),
                                                  (97, 0, 97, 7, 1, 64), (300, 12, 333, 2, 2, 128)])
def test_sdpa_bf16_cache_mask_gives_causal_bits(isa, s, past, cap, hq, hkv, d):
    """A compiled prefill attends over the whole cache [.., cap, d] under a
    bool mask [b, 1, s, cap] showing each query the slots up to its own; the
    eager one over the filled slots with is_causal. The mask, read a block
    row as bits, gives the causal call's bits, and a mask with holes (left
    padding, a hidden block, scattered keys; no causal flag) torch's."""
    t = past + s
    q, k, v = qkv(2, hq, hkv, s, cap, d, dtype="bf16")
    keep = (torch.arange(cap)[None, :] <= torch.arange(s)[:, None] + past).expand(2, 1, s, cap).clone()
    got = to_torch(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep)))
    want = to_torch(hubrt.ops.sdpa(to_hr(q), to_hr(k[:, :, :t]), to_hr(v[:, :, :t]), is_causal=True))
    assert torch.equal(got, want)
    holes = keep.clone()
    holes[0, ..., :5] = False  # left padding
    holes[1, ..., 64:128] = False  # a whole key block
    holes &= torch.rand(2, 1, s, cap, generator=torch.Generator().manual_seed(3)) > 0.2
    holes |= torch.arange(cap)[None, :] == torch.arange(s)[:, None] + past  # each row sees its own slot
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(holes)), q, k, v, mask=holes)


def test_sdpa_bf16_long_prefill_chunks(isa):
    """s = t = 1109 with 7 heads per kv head: 7763 rows, 162 query blocks
    in chunks of up to 16, the causal diagonal crossing every key block."""
    q, k, v = qkv(1, 7, 1, 1109, 1109, 128, dtype="bf16")
    check_bf16(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=True), q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,dv", [(40, 32), (48, 64), (128, 64), (64, 96)])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (3, 1)])
def test_sdpa_decode_direct_head_dims(isa, dtype, d, dv, hq, hkv):
    """Decode rows read in place (value dims in whole 32s) with d != dv:
    the key rows' prefetch spread over the value passes, bf16 widened in
    even/odd lanes where d is a multiple of 16 (48: one 16 past a 32) and
    the plain widening where it is not (40), two rows per kv head and two
    plus one; 300 keys in two splits, the second short."""
    q, k, v = qkv(1, hq, hkv, 1, 300, d, dv=dv, dtype=dtype)
    check_any(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v)), q, k, v, dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sdpa_decode_window_empties_splits(isa, dtype):
    """One query at the end of 600 keys with a window of 100: the first two
    key splits lie wholly outside the window, so their units read nothing
    and leave nothing to the merge, and the one before the last unit has
    no block to prefetch."""
    q, k, v = qkv(1, 4, 2, 1, 600, 64, dtype=dtype)
    check_any(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), window=100), q, k, v, dtype, atol=2e-5, window=100)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sdpa_decode_hidden_blocks_across_units(isa, dtype):
    """A bool mask over 700 keys (three splits) that hides whole key
    blocks: the middle of the first split, the start of the second (so the
    unit before it finds the next block to read further on) and all of
    the third but one key; batch 3 with its own masks per row."""
    b, hq, hkv, t, d = 3, 4, 2, 700, 64
    q, k, v = qkv(b, hq, hkv, 1, t, d, dtype=dtype)
    keep = torch.ones(b, 1, 1, t, dtype=torch.bool)
    keep[..., 64:192] = False
    keep[..., 256:448] = False
    keep[..., 512:] = False
    keep[..., 650] = True
    keep[1, ..., :256] = False
    keep[2, ..., 600:] = True
    check_any(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep)), q, k, v, dtype, atol=2e-5, mask=keep)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sdpa_decode_long_context(isa, dtype):
    """Decode over 20001 keys: past 64 key splits of 256 the splits grow
    (320 keys here, the last one short), so that their partial results stay
    bounded; under a bool mask hiding a span that crosses split edges."""
    b, hq, hkv, t, d = 2, 4, 2, 20001, 64
    q, k, v = qkv(b, hq, hkv, 1, t, d, dtype=dtype)
    keep = torch.ones(b, 1, 1, t, dtype=torch.bool)
    keep[1, ..., 300:13000] = False
    check_any(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep)), q, k, v, dtype, atol=2e-5, mask=keep)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("hq,hkv,d,t", [(16, 8, 128, 540), (12, 4, 128, 40), (9, 3, 64, 300), (8, 2, 64, 40),
                                        (4, 2, 256, 70)])
def test_decode_rows_of_a_kv_head_give_their_bits_alone(isa, dtype, hq, hkv, d, t):
    """A decode unit scores the query rows that share a kv head together
    (the AVX-512 BF16 unit two per K read at d = 128, the AVX2 one two per
    K read always), each row
    summing its products in the order it would alone: GQA attention gives
    bit for bit what the same heads give with K/V repeated per query head
    (one row per kv head). Key splits grow with the kv heads per thread, so
    both calls run on a pool of a thread per query head, where the splits
    are 256 keys for either (t = 540 and 300 in several)."""
    q, k, v = qkv(2, hq, hkv, 1, t, d, dtype=dtype)
    rep = hq // hkv
    threads = lib.hr_num_threads()
    lib.hr_set_num_threads(max(hq, threads))
    try:
        got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v))
        alone = hubrt.ops.sdpa(to_hr(q), to_hr(k.repeat_interleave(rep, 1).contiguous()),
                               to_hr(v.repeat_interleave(rep, 1).contiguous()))
    finally:
        lib.hr_set_num_threads(threads)
    assert torch.equal(to_torch(got).view(-1).view(torch.int16 if dtype == "bf16" else torch.int32),
                       to_torch(alone).view(-1).view(torch.int16 if dtype == "bf16" else torch.int32))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert_close(got, want, atol=1e-4 if dtype == "f32" else None)


# ---- exact (batch-invariant) path ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,causal,window,softcap", [(1, False, 0, 0.0), (5, True, 0, 0.0), (3, True, 4, 0.0),
                                                    (2, False, 0, 30.0)])
def test_sdpa_exact_matches_torch(dtype, s, causal, window, softcap):
    q, k, v = qkv(2, 6, 2, s, 23, 64, dtype=dtype)
    keep = torch.rand(2, 1, s, 23, generator=torch.Generator().manual_seed(3)) > 0.2
    keep[..., -1] = True
    want = reference(q, k, v, mask=keep, causal=causal, window=window, softcap=softcap)
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(keep), is_causal=causal, window=window,
                         softcap=softcap, exact=True)
    assert_close(got, want)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sdpa_exact_is_invariant_to_where_keys_lie(dtype):
    """One decode query over its n keys: alone (keys at 0..n-1, batch 1) and in a batch of 3 whose cache
    holds them at an offset among other rows' cells, masked, and rotated in a ring (exact_from):
    bitwise the same output. The blocked kernel need not be (its key blocks start at cell 0)."""
    n, t, d = 77, 200, 64
    q, k, v = qkv(1, 4, 2, 1, n, d, dtype=dtype)
    alone = to_torch(hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), exact=True))
    for off in (0, 5, 64, 123):
        kb, vb = rand(3, 2, t, d, dtype=dtype, seed=7), rand(3, 2, t, d, dtype=dtype, seed=8)
        kb[1, :, off:off + n], vb[1, :, off:off + n] = k[0], v[0]
        keep = torch.zeros(3, 1, 1, t, dtype=torch.bool)
        keep[:, ..., :50] = True
        keep[1, ..., :] = False
        keep[1, ..., off:off + n] = True
        qb = rand(3, 4, 1, d, dtype=dtype, seed=9)
        qb[1] = q[0]
        got = to_torch(hubrt.ops.sdpa(to_hr(qb), to_hr(kb), to_hr(vb), to_hr(keep), exact=True))
        assert torch.equal(got[1:2], alone), off
        # the same keys in a ring of t slots whose oldest is slot r (key i in slot (r + i) % t)
        r = (off * 7) % t
        kr, vr = torch.zeros(1, 2, t, d, dtype=k.dtype), torch.zeros(1, 2, t, d, dtype=v.dtype)
        slots = [(r + i) % t for i in range(n)]
        kr[0, :, slots], vr[0, :, slots] = k[0], v[0]
        ring_keep = torch.zeros(1, 1, 1, t, dtype=torch.bool)
        ring_keep[..., slots] = True
        got = to_torch(hubrt.ops.sdpa(to_hr(q), to_hr(kr), to_hr(vr), to_hr(ring_keep), exact=True,
                                      exact_from=r))
        assert torch.equal(got, alone), ("ring", off)


# ---- sinks (gpt-oss) -------------------------------------------------------------------------------

def sinks_reference(q, k, v, sinks, mask=None, causal=False, window=0):
    """transformers' gpt-oss eager attention (GptOss eager_attention_forward):
    the head's sink logit joins the scores, the softmax takes it, its
    probability is dropped; a row with no visible key gives 0."""
    q, k, v = q.float(), k.float(), v.float()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s, t = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    keep = torch.ones(s, t, dtype=torch.bool)
    pq, pk = torch.arange(s)[:, None] + t - s, torch.arange(t)[None, :]
    if causal:
        keep &= pk <= pq
    if window:
        keep &= pq - pk < window
    if mask is not None:
        keep = keep & mask
    scores = scores.masked_fill(~keep, float("-inf"))
    sink = sinks.float().reshape(1, -1, 1, 1).expand(q.shape[0], -1, s, 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return probs @ v


# decode (one and few rows, key splits at t = 700), prefill causal and full,
# a sliding window, a padding mask with a fully masked row
SINK_CASES = [(1, 1, 2), (1, 700, 0), (3, 40, 0), (64, 64, 0), (33, 90, 16)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("s,t,window", SINK_CASES)
def test_sdpa_sinks(isa, dtype, s, t, window):  # noqa: F811
    q, k, v = qkv(2, 4, 2, s, t, 64, dtype=dtype)
    sinks = rand(4, seed=9) * 2
    causal = s > 1
    want = sinks_reference(q, k, v, sinks, causal=causal, window=window)
    got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=causal, window=window, sinks=to_hr(sinks))
    assert_close(got, want, atol=1e-5 if dtype == "f32" else None)
    exact = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), is_causal=causal, window=window, sinks=to_hr(sinks),
                           exact=True)
    assert_close(exact, want, atol=1e-5 if dtype == "f32" else None)


def test_sdpa_sinks_with_mask_and_large_sinks():
    """A padding mask that hides every key of one row (0 out, the sink takes
    it all), and sinks far above the scores (they take nearly all)."""
    q, k, v = qkv(2, 4, 4, 5, 9, 32)
    mask = torch.ones(2, 1, 5, 9, dtype=torch.bool)
    mask[1, :, 2, :] = False
    mask[0, :, :, :3] = False
    for sinks in (rand(4, seed=4), torch.tensor([30.0, -30.0, 0.0, 80.0])):
        want = sinks_reference(q, k, v, sinks, mask=mask)
        got = hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), to_hr(mask), sinks=to_hr(sinks))
        assert_close(got, want, atol=1e-5)
        assert not to_torch(got)[1, :, 2].any()


def test_sdpa_sinks_on_xla_cpu():
    import numpy as np
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    q, k, v = qkv(1, 4, 2, 6, 11, 32)
    sinks = rand(4, seed=5)
    mask = torch.ones(1, 1, 6, 11, dtype=torch.bool)
    mask[..., :2] = False
    want = sinks_reference(q, k, v, sinks, mask=mask, causal=True)
    dev = [to_hr(t).to("xla_cpu") for t in (q, k, v, mask, sinks)]
    got = hubrt.ops.sdpa(dev[0], dev[1], dev[2], dev[3], is_causal=True, sinks=dev[4])
    assert_close(got.to("cpu"), want, atol=1e-5)


def test_sdpa_sinks_errors():
    q, k, v = qkv(1, 4, 2, 3, 5, 32)
    with pytest.raises(hubrt.HubrtError, match=r"the sinks input must be \[4\]"):
        hubrt.ops.sdpa(to_hr(q), to_hr(k), to_hr(v), sinks=to_hr(torch.zeros(3)))
    with pytest.raises(hubrt.HubrtError, match=r"attr sinks set but no sinks input"):
        hubrt.ops.call("sdpa", to_hr(q), to_hr(k), to_hr(v), sinks=True)
