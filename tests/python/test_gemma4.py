"""Gemma 4 text models against transformers (torch 2.13 CPU) on tiny random
checkpoints saved by transformers: float32 logits <= 1e-4 of the logit
range and greedy generations token-identical over 64 tokens. Variants: the
dense layout (sliding layers of head_dim 16, full layers of 32 with their
own proportional rope), attention_k_eq_v with one global kv head, the
26B-A4B layout (the MoE block beside the MLP, Gemma 4's router, soft-capped
logits), the E2B layout (per-layer embeddings, the last layers reading
earlier layers' keys, double-wide MLPs there), and all at once; window 8
over a ring cache; batch 4 with left padding; eager and compiled; cpu and
xla_cpu; bf16; the Hub's config spelling (global_head_dim) and the
multimodal class's names; the errors for configs hubrt refuses. Every
parameter of rank <= 1 is perturbed, and so is each layer's layer_scalar
(a buffer transformers saves)."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

import hubrt
from gemma3_util import hf_logits, random_ids, redraw, rel_err
from moe_util import (check_compiled_generation, check_greedy, check_padded_logits, check_xla_cpu_generation,  # noqa: F401
                      check_xla_cpu_logits, copy_with, hr_model, private_plan_cache)

TOL = 1e-4
TYPES5 = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8, layer_types=TYPES5,
            max_position_embeddings=512, hidden_size_per_layer_input=0, bos_token_id=2, eos_token_id=1,
            pad_token_id=0)
MOE = dict(enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=24)
PLE = dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=256)
VARIANTS = {
    "dense": {},
    "k-eq-v": dict(attention_k_eq_v=True, num_global_key_value_heads=1),
    "26b-a4b": dict(attention_k_eq_v=True, num_global_key_value_heads=1, final_logit_softcapping=30.0, **MOE),
    "e2b": dict(num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0, **PLE),
    "all": dict(attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
                use_double_wide_mlp=True, final_logit_softcapping=30.0, **MOE, **PLE),
}


def save(path, seed, dtype=None, **overrides):
    torch.manual_seed(0)
    model = redraw(Gemma4ForCausalLM(Gemma4TextConfig(**{**BASE, **overrides})).eval(), seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:  # a buffer: redraw() leaves it at 1
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    made = {}

    def get(name):
        if name not in made:
            made[name] = save(root / name, seed=list(VARIANTS).index(name) + 1, **VARIANTS[name])
        return made[name]

    return get


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_f32_match_transformers(ckpts, name):
    path = ckpts(name)
    ids = random_ids((2, 37), seed=1)  # past the window of 8
    got = hr_model(path)(ids).logits
    want = hf_logits(path, ids)
    assert got.shape == want.shape == (2, 37, 256)
    assert rel_err(got, want) <= TOL


def test_the_details_matter(ckpts, tmp_path):
    """layer_scalar, the router's scale and per-expert scale, the per-layer
    embeddings and their norm each move the logits: changing one in the
    checkpoint changes transformers' logits and hubrt follows."""
    src = ckpts("all")
    ids = random_ids((1, 19), seed=2)
    base = hf_logits(src, ids)
    for key, fill in (("layer_scalar", 1.0), ("router.scale", 1.0), ("router.per_expert_scale", 1.0),
                      ("embed_tokens_per_layer.weight", 0.0), ("per_layer_projection_norm.weight", 1.0),
                      ("post_per_layer_input_norm.weight", 1.0)):
        def change(t, key=key, fill=fill):
            for k in t:
                if k.endswith(key):
                    t[k] = torch.full_like(t[k], fill)
        path = copy_with(src, tmp_path / key.replace(".", "-"), tensors=change)
        want = hf_logits(path, ids)
        assert rel_err(want, base) > 1e-3, key
        assert rel_err(hr_model(path)(ids).logits, want) <= TOL, key


def test_hub_config_spelling(ckpts, tmp_path):
    """Hub configs give the full layers' sizes as global_head_dim and
    num_global_key_value_heads, not per_layer_config: the same model."""
    src = ckpts("26b-a4b")
    cfg = json.loads((src / "config.json").read_text())
    assert "per_layer_config" in cfg
    del cfg["per_layer_config"]
    cfg.update(global_head_dim=32, num_global_key_value_heads=1)
    dst = copy_with(src, tmp_path / "hub")
    (dst / "config.json").write_text(json.dumps(cfg))
    ids = random_ids((2, 13), seed=3)
    np.testing.assert_array_equal(hr_model(dst)(ids).logits, hr_model(src)(ids).logits)


def test_multimodal_class_reads_its_text_model(ckpts, tmp_path):
    """Gemma4ForConditionalGeneration's files: the text config under
    text_config, the weights under model.language_model.; the vision
    tower's weights are left alone."""
    src = ckpts("e2b")
    text = json.loads((src / "config.json").read_text())
    dst = tmp_path / "mm"
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForConditionalGeneration"],
                                                 "model_type": "gemma4", "text_config": text,
                                                 "tie_word_embeddings": True}))
    t = {k.replace("model.", "model.language_model.", 1): v for k, v in load_file(src / "model.safetensors").items()}
    t["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(4, 4)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    ids = random_ids((1, 21), seed=4)
    np.testing.assert_array_equal(hr_model(dst)(ids).logits, hr_model(src)(ids).logits)


def test_batch_of_4_with_left_padding(ckpts):
    check_padded_logits(ckpts("all"), TOL)


def test_eager_and_grouped_agree(ckpts):
    path = ckpts("26b-a4b")
    ids = random_ids((2, 17), seed=7)
    a = hr_model(path)(ids).logits
    b = hr_model(path, experts_implementation="eager")(ids).logits
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
@pytest.mark.parametrize("name", ["dense", "26b-a4b", "e2b", "all"])
def test_greedy_generation_matches_transformers(ckpts, name):
    check_greedy(ckpts(name))


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_greedy_batch_with_left_padding(ckpts):
    check_greedy(ckpts("all"), batch_pads=[0, 2, 5, 8])


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_compiled_generation_and_steps_match_eager(ckpts, private_plan_cache):
    check_compiled_generation(ckpts("all"), TOL, seed=8)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
@pytest.mark.parametrize("name", ["26b-a4b", "e2b"])
def test_bf16_as_close_to_f32_as_torch_bf16(tmp_path, name):
    """bf16 against the float32 truth: hubrt's error and top-1 agreement
    are no worse than transformers' own bf16 run, summed over three
    checkpoints (on one tiny random model either may land far from the
    truth: routing on bf16 logits flips experts near ties, and the max
    error of one draw swings by 3x between seeds)."""
    ids = random_ids((4, 32), seed=10)
    err = {"hubrt": 0.0, "torch": 0.0}
    top1 = {"hubrt": 0.0, "torch": 0.0}
    for seed in (1, 2, 3):
        path = save(tmp_path / str(seed), seed=seed, **VARIANTS[name])
        truth = hf_logits(path, ids)
        runs = {"torch": hf_logits(Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), ids),
                "hubrt": hr_model(path, dtype="bfloat16")(ids).logits}
        for who, got in runs.items():
            err[who] += rel_err(got, truth)
            top1[who] += (got.argmax(-1) == truth.argmax(-1)).mean() / 3
    assert err["hubrt"] <= 1.25 * err["torch"]
    assert top1["hubrt"] >= top1["torch"] - 0.03


def test_xla_cpu_logits_match_cpu_and_transformers(ckpts):
    check_xla_cpu_logits(ckpts("all"), TOL)


@pytest.mark.slow  # eager xla_cpu compiles each op per new shape
def test_xla_cpu_generation_matches_cpu(ckpts, private_plan_cache):
    check_xla_cpu_generation(ckpts("all"))


@pytest.mark.parametrize("config,message", [
    ({"use_bidirectional_attention": "all"}, r"use_bidirectional_attention 'all' .* is not supported"),
    ({"num_kv_shared_layers": 5}, r"num_kv_shared_layers is 5; it must be in 0\.\.4"),
    ({"num_kv_shared_layers": 4}, r"layer 1 \(full_attention\) shares keys \(num_kv_shared_layers 4\), but no "
                                  r"earlier layer of its kind makes them"),
    ({"per_layer_config": {"0": {"head_dim": 32}}}, r"per_layer_config\['0'\] gives a sliding layer its own"),
    ({"per_layer_config": {"1": {"head_dim": 32}, "4": {"head_dim": 64}}},
     r"per_layer_config\['4'\] \(head_dim 64, 2 kv heads\) differs from other full layers"),
    ({"per_layer_config": {"1": {"sliding_window": 4}}}, r"sets 'sliding_window'; Gemma 4 layers may set head_dim"),
    ({"per_layer_config": {"x": {}}}, r"per_layer_config key 'x' is not a layer index"),
    ({"top_k_experts": 9}, r"top_k_experts is 9, not 1 to num_experts \(8\)"),
    ({"num_experts": None}, r"enable_moe_block is true but num_experts is not set"),
    ({"per_layer_config": {"1": {"head_dim": 16}, "4": {"head_dim": 16}}},
     r"'model\.layers\.1\.self_attn\.q_proj\.weight' is \[128, 64\], not the \[64, 64\] computed from "
     r"num_attention_heads x head_dim \(4 x 16\)"),
    ({"global_head_dim": 48, "per_layer_config": None},
     r"'model\.layers\.1\.self_attn\.q_proj\.weight' is \[128, 64\], not the \[192, 64\] computed from "
     r"num_attention_heads x the full layers' head_dim \(4 x 48\)"),
    ({"rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 2.0}}},
     r"partial_rotary_factor 2 must be in \[0, 1\]"),
    ({"hidden_activation": "silu"}, r"hidden_act 'silu' is not supported by Gemma4ForCausalLM"),
])
def test_bad_config_is_refused_naming_the_field(ckpts, tmp_path, config, message):
    path = copy_with(ckpts("26b-a4b"), tmp_path / "bad", config=config)
    with pytest.raises(hubrt.HubrtError, match=message):
        hr_model(path)


def test_missing_layer_weight_is_named(ckpts, tmp_path):
    def drop(t):
        del t["model.layers.2.router.per_expert_scale"]
    path = copy_with(ckpts("26b-a4b"), tmp_path / "drop", tensors=drop)
    with pytest.raises(hubrt.HubrtError, match=r"missing tensor 'model\.layers\.2\.router\.per_expert_scale'"):
        hr_model(path)
