"""gpt-oss against transformers (torch 2.13 CPU) on tiny random checkpoints
saved by transformers (experts as it holds them: gate_up [E, H, 2I]
interleaved, down [E, I, H], with biases): float32 logits <= 1e-4 of the
logit range and greedy generations token-identical over 64 tokens; 8
experts with top-2, top-1 and top-k = E; attention sinks; alternating
sliding-window (8) and full layers over a ring cache; yarn rope; a router
bias that sends every token to one expert; batch 4 with left padding; eager
and compiled; cpu and xla_cpu; bf16; a tight swiglu_limit that clamps; the
Hub's MXFP4 experts (dequantized at load as transformers does) and the
errors for other quant_methods and bad configs. Every parameter of rank
<= 1 (norms, biases, sinks, the router's bias) is perturbed."""
import numpy as np
import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM

import hubrt
from gemma3_util import hf_logits, random_ids, redraw, rel_err
from moe_util import (check_compiled_generation, check_greedy, check_padded_logits, check_xla_cpu_generation,  # noqa: F401
                      check_xla_cpu_logits, copy_with, hr_model, private_plan_cache)

TOL = 1e-4
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
            max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=2,
            eos_token_id=1, pad_token_id=0,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 128, "rope_theta": 150000.0})
VARIANTS = {
    "top2": {},
    "top1": dict(num_experts_per_tok=1),
    "topE": dict(num_experts_per_tok=8),
    "full-nobias": dict(layer_types=["full_attention"] * 4, attention_bias=False),
    "tight-limit": dict(swiglu_limit=0.5, num_key_value_heads=1),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptoss")
    made = {}

    def get(name, **overrides):
        if name not in made:
            torch.manual_seed(0)
            model = redraw(GptOssForCausalLM(GptOssConfig(**{**BASE, **overrides})).eval(), seed=len(made) + 1)
            if name == "tight-limit":  # large activations, so the clamp bites
                with torch.no_grad():
                    for layer in model.model.layers:
                        layer.mlp.experts.gate_up_proj.mul_(4.0)
            model.save_pretrained(root / name)
            made[name] = root / name
        return made[name]

    return get










@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_f32_match_transformers(ckpts, name):
    path = ckpts(name, **VARIANTS[name])
    ids = random_ids((2, 37), seed=1)  # past the window of 8
    got = hr_model(path)(ids).logits
    want = hf_logits(path, ids)
    assert got.shape == want.shape == (2, 37, 256)
    assert rel_err(got, want) <= TOL


def test_the_details_matter(ckpts, tmp_path):
    """Sinks, the router's bias and the experts' biases each move the
    logits: zeroing one in the checkpoint changes transformers' logits and
    hubrt follows."""
    src = ckpts("top2")
    ids = random_ids((1, 19), seed=2)
    base = hf_logits(src, ids)
    for key in ("self_attn.sinks", "mlp.router.bias", "mlp.experts.gate_up_proj_bias"):
        def zero(t, key=key):
            for k in t:
                if k.endswith(key):
                    t[k] = torch.zeros_like(t[k])
        path = copy_with(src, tmp_path / key.replace(".", "-"), tensors=zero)
        want = hf_logits(path, ids)
        assert rel_err(want, base) > 1e-3, key
        assert rel_err(hr_model(path)(ids).logits, want) <= TOL


def test_router_bias_sends_every_token_to_one_expert(ckpts, tmp_path):
    def one_expert(t):
        for k in t:
            if k.endswith("mlp.router.weight"):
                t[k] = torch.zeros_like(t[k])
            if k.endswith("mlp.router.bias"):
                t[k] = torch.zeros_like(t[k])
                t[k][5] = 10.0
    path = copy_with(ckpts("top1", **VARIANTS["top1"]), tmp_path / "one", tensors=one_expert)
    ids = random_ids((2, 15), seed=3)
    assert rel_err(hr_model(path)(ids).logits, hf_logits(path, ids)) <= TOL


def test_batch_of_4_with_left_padding(ckpts):
    path = ckpts("top2")
    check_padded_logits(path, TOL)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
@pytest.mark.parametrize("name", ["top2", "topE", "tight-limit"])
def test_greedy_generation_matches_transformers(ckpts, name):
    path = ckpts(name, **VARIANTS[name])
    check_greedy(path)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_greedy_batch_with_left_padding(ckpts):
    check_greedy(ckpts("top2"), batch_pads=[0, 2, 5, 8])


def test_eager_and_grouped_agree(ckpts):
    path = ckpts("topE", **VARIANTS["topE"])
    ids = random_ids((2, 17), seed=7)
    a = hr_model(path)(ids).logits
    b = hr_model(path, experts_implementation="eager")(ids).logits
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_compiled_generation_and_steps_match_eager(ckpts, private_plan_cache):
    check_compiled_generation(ckpts("top2"), TOL, seed=8)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_bf16_as_close_to_f32_as_torch_bf16(ckpts):
    """bf16 against the float32 truth: hubrt's error and top-1 agreement
    are no worse than transformers' own bf16 run (on this tiny random model
    both drift: routing on bf16 logits flips experts near ties)."""
    path = ckpts("top2")
    ids = random_ids((4, 32), seed=10)
    truth = hf_logits(path, ids)
    torch_bf16 = hf_logits(GptOssForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), ids)
    for impl in ("grouped", "eager"):
        got = hr_model(path, dtype="bfloat16", experts_implementation=impl)(ids).logits
        assert rel_err(got, truth) <= 1.25 * rel_err(torch_bf16, truth)
        assert (got.argmax(-1) == truth.argmax(-1)).mean() >= (torch_bf16.argmax(-1) == truth.argmax(-1)).mean() - 0.03


def test_xla_cpu_logits_match_cpu_and_transformers(ckpts):
    check_xla_cpu_logits(ckpts("top2"), TOL)


@pytest.mark.slow  # eager xla_cpu compiles each op per new shape
def test_xla_cpu_generation_matches_cpu(ckpts, private_plan_cache):
    check_xla_cpu_generation(ckpts("top2"))


@pytest.mark.parametrize("config,message", [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, r"quant_method 'bitsandbytes' is not supported"),
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok is 9, not 1 to num_local_experts \(8\)"),
    ({"swiglu_limit": 0}, r"swiglu_limit 0 must be positive"),
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]},
     r"layer_types\[1\] is 'chunked_attention'; gpt-oss layers are"),
    ({"intermediate_size": 16}, r"'model.layers.0.mlp.experts.gate_up_proj' is \[8, 64, 64\], not the \[8, 64, 32\] "
                                r"computed from 2 x intermediate_size \(32\)"),
])
def test_bad_config_is_refused_naming_the_field(ckpts, tmp_path, config, message):
    path = copy_with(ckpts("top2"), tmp_path / "bad", config=config)
    with pytest.raises(hubrt.HubrtError, match=message):
        hr_model(path)


def mxfp4_pair(src, tmp_path, scale_lo=118, scale_hi=131):
    """An MXFP4 checkpoint as the Hub's gpt-oss releases hold it (random e2m1
    codes and e8m0 scales as each expert weight's _blocks and _scales, the
    op's [E, 2I, H] / [E, H, I] orientation), and the dense checkpoint that
    transformers' own dequantizer (convert_moe_packed_tensors) makes of it."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    rng = np.random.default_rng(11)
    packed = {}

    def pack(t):
        for key in [k for k in t if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj")]:
            e, a, b = t[key].shape  # transformers' [E, H, 2I] and [E, I, H]: the blocks are [E, b, a / 32, 16]
            blocks = torch.from_numpy(rng.integers(0, 256, (e, b, a // 32, 16), dtype=np.uint8))
            scales = torch.from_numpy(rng.integers(scale_lo, scale_hi, (e, b, a // 32), dtype=np.uint8))
            packed[key] = (blocks, scales)
            del t[key]
            t[key + "_blocks"], t[key + "_scales"] = blocks, scales

    def dense(t):
        for key, (blocks, scales) in packed.items():
            t[key] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()

    q = copy_with(src, tmp_path / "mxfp4", config={"quantization_config": {"quant_method": "mxfp4"}}, tensors=pack)
    return q, copy_with(src, tmp_path / "dense", tensors=dense)


def test_mxfp4_checkpoint_dequantized_as_transformers_does(ckpts, tmp_path):
    """The Hub's MXFP4 experts load, dequantized at load: the same weights
    (so the same logits, bit for bit) as the dense checkpoint transformers'
    dequantizer gives, and within TOL of transformers on it."""
    q, dense = mxfp4_pair(ckpts("top2"), tmp_path)
    ids = random_ids((2, 21), seed=5)
    got = hr_model(q)(ids).logits
    np.testing.assert_array_equal(got, hr_model(dense)(ids).logits)
    assert rel_err(got, hf_logits(dense, ids)) <= TOL
    bf16 = hubrt.AutoModelForCausalLM.from_pretrained(q, dtype="bfloat16")(ids).logits
    np.testing.assert_array_equal(bf16, hubrt.AutoModelForCausalLM.from_pretrained(dense, dtype="bfloat16")(ids).logits)


def test_mxfp4_bad_blocks_named(ckpts, tmp_path):
    q, _ = mxfp4_pair(ckpts("top2"), tmp_path)

    def cut(t):
        k = "model.layers.1.mlp.experts.down_proj_scales"
        t[k] = t[k][:, :, :0].contiguous()
    bad = copy_with(q, tmp_path / "bad", tensors=cut)
    with pytest.raises(hubrt.HubrtError, match=r"MXFP4 tensor 'model.layers.1.mlp.experts.down_proj_scales' is "
                                               r"\[8, 64, 0\] u8, expected u8 \[8, 64, 1\]"):
        hr_model(bad)
