"""Rope scaling against transformers itself: hr_rope_inv_freq (through
hubrt.rope, a ctypes binding of hr_rope_config) vs LlamaRotaryEmbedding and
ROPE_INIT_FUNCTIONS for every rope type, then the cos/sin tables and the
rotated q from hubrt's ops vs the embedding's forward and
apply_rotary_pos_emb.

inv_freq matches bit for bit except where torch's f32 pow (SLEEF, 1 ulp)
and the correctly rounded pow hubrt uses part: at most a few elements,
each a pow's last bit apart."""
import warnings

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import hubrt
from hubrt import rope
from oracle import to_hr, to_torch

MAXP = 4096


def longrope_params(half):
    return dict(rope_type="longrope", original_max_position_embeddings=1024,
                short_factor=[1.0 + 0.01 * i for i in range(half)],
                long_factor=[1.5 + 0.1 * i for i in range(half)])


def cases(head_dim):
    half = head_dim // 2
    return {
        "default": dict(rope_type="default"),
        "linear": dict(rope_type="linear", factor=2.5),
        "dynamic": dict(rope_type="dynamic", factor=3.0),
        "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024),
        "yarn_mscale": dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096, mscale=0.707,
                            mscale_all_dim=0.707, beta_fast=16, truncate=False),
        "yarn_attention_factor": dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=2048,
                                      attention_factor=0.8, beta_slow=2),
        "yarn_no_factor": dict(rope_type="yarn", factor=None, original_max_position_embeddings=1024),
        "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=512),
        "longrope": longrope_params(half),
        "longrope_factor": dict(longrope_params(half), factor=4.0, attention_factor=1.2),
    }


def hf_embedding(params, head_dim, theta):
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=MAXP, rope_parameters=dict(params, rope_theta=theta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaRotaryEmbedding(cfg)


def assert_freqs_match(got, want):
    """Equal, but for at most 3 elements a pow's last bit apart (2 ulp when
    dynamic rope's theta went through a pow too)."""
    want = want.numpy()
    diff = got != want
    assert diff.sum() <= 3, f"{diff.sum()} of {got.size} frequencies differ"
    assert (abs(got[diff] - want[diff]) <= 2 * np.spacing(abs(want[diff]))).all()


# only dynamic and longrope depend on the sequence length: below, at and
# past max_position_embeddings (and longrope's original length)
SEQ_CASES = [(name, seq) for name in cases(64)
             for seq in ([100, 4096, 9000] if name.startswith(("dynamic", "longrope")) else [4096])]


@pytest.mark.parametrize("name,seq_len", SEQ_CASES)
@pytest.mark.parametrize("theta,head_dim", [(10000.0, 64), (500000.0, 128), (12345.6, 80)])
def test_inv_freq_and_scaling_vs_transformers(name, seq_len, theta, head_dim):
    params = cases(head_dim)[name]
    emb = hf_embedding(params, head_dim, theta)
    # the forward updates dynamic / longrope frequencies for the sequence it sees
    emb(torch.zeros(1), torch.arange(seq_len)[None])
    got, scaling = rope.inv_freq(dict(params, rope_theta=theta), head_dim, MAXP, seq_len)
    assert scaling == emb.attention_scaling
    assert_freqs_match(got, emb.inv_freq)


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3", "longrope"])
def test_partial_rotary_vs_rope_init_functions(rope_type):
    head_dim, partial = 64, 0.5
    params = dict(cases(int(head_dim * partial))[rope_type], rope_theta=10000.0, partial_rotary_factor=partial)
    if rope_type == "dynamic":
        params["factor"] = 2.0
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=MAXP, rope_parameters=dict(params))
    want, want_scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, seq_len=6000)
    got, scaling = rope.inv_freq(params, head_dim, MAXP, 6000)
    assert got.shape == (16,)
    assert scaling == want_scaling
    assert_freqs_match(got, want)


@pytest.mark.parametrize("name", ["default", "dynamic", "yarn_mscale", "llama3", "longrope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cos_sin_and_rope_vs_transformers(name, dtype):
    head_dim, seq = 64, 4097 + 1000
    params = cases(head_dim)[name]
    emb = hf_embedding(params, head_dim, 10000.0)
    pos = torch.arange(seq).reshape(1, seq)
    x = torch.zeros(1, dtype=dtype)
    cos, sin = emb(x, pos)
    inv, scaling = rope.inv_freq(dict(params, rope_theta=10000.0), head_dim, MAXP, seq)
    hc, hs = hubrt.ops.rope_cos_sin(to_hr(pos), hubrt.from_numpy(inv), scaling,
                                    dtype="f32" if dtype == torch.float32 else "bf16")
    # cos/sin of the same f32 angle: torch's SLEEF is within 1 ulp of hubrt's
    # correctly rounded values; angles themselves can carry pow's 1-ulp
    # frequency difference times the position
    tol = dict(atol=2e-6 * seq * 2.0**-12 + 1e-6, rtol=0) if dtype == torch.float32 else dict(atol=8e-3, rtol=0)
    torch.testing.assert_close(to_torch(hc).float(), cos.float(), **tol)
    torch.testing.assert_close(to_torch(hs).float(), sin.float(), **tol)
    # rope on transformers' own cos/sin: bit for bit
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3, seq, head_dim, generator=g).to(dtype)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    got = hubrt.ops.rope(to_hr(q), to_hr(cos).unsqueeze(1), to_hr(sin).unsqueeze(1))
    assert torch.equal(to_torch(got), want)


@pytest.mark.parametrize("partial,factor", [(0.25, None), (0.5, 2.0), (0.3, None), (0.0, None), (1.0, None)])
@pytest.mark.parametrize("head_dim", [32, 512])
def test_proportional_vs_rope_init_functions(partial, factor, head_dim):
    """Gemma 4's full layers: the whole head's frequencies for the first
    int(partial * head_dim // 2) pairs, 0 for the rest, all / factor."""
    params = dict(rope_type="proportional", rope_theta=1e6, partial_rotary_factor=partial)
    if factor:
        params["factor"] = factor
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=MAXP, rope_parameters=dict(params))
    want, want_scaling = ROPE_INIT_FUNCTIONS["proportional"](cfg)
    got, scaling = rope.inv_freq(params, head_dim, MAXP)
    assert got.shape == (head_dim // 2,)
    assert scaling == want_scaling
    assert (got[int(partial * head_dim // 2):] == 0).all()
    assert_freqs_match(got, want)


def test_errors_name_the_rope_type_and_field():
    with pytest.raises(hubrt.HubrtError, match=r"rope \(llama3\): original_max_position_embeddings"):
        rope.inv_freq(dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=None), 64, 0)
    with pytest.raises(hubrt.HubrtError, match=r"rope \(linear\): factor must be > 0"):
        rope.inv_freq(dict(rope_type="linear"), 64, MAXP)
    with pytest.raises(hubrt.HubrtError, match=r"rope \(longrope\): short_factor and long_factor"):
        rope.inv_freq(dict(rope_type="longrope", original_max_position_embeddings=1024), 64, MAXP)
    with pytest.raises(hubrt.HubrtError, match=r"rotary_dim must be even"):
        rope.inv_freq(dict(rope_type="default", partial_rotary_factor=0.3), 10, MAXP)
    with pytest.raises(ValueError, match="unknown rope_type 'ntk'"):
        rope.inv_freq(dict(rope_type="ntk"), 64, MAXP)
