"""Qwen3-MoE against transformers (torch 2.13 CPU) on tiny random
checkpoints saved by transformers itself (per-expert tensors, as
transformers 5 saves them; and the stacked [E, 2I, H] form): float32 logits
<= 1e-4 of the logit range and greedy generations token-identical over 64
tokens, for 8 experts with top-2, top-1, top-k = E renormalised,
decoder_sparse_step 2 with mlp_only_layers, and a router that sends every
token to one expert; batch 4 with left padding; eager and compiled; cpu
and xla_cpu; the "grouped" and "eager" experts implementations; bf16; and
the errors for bad configs and checkpoints. Every parameter of rank <= 1 is
perturbed (gemma3_util.redraw), so a norm or bias read wrongly shows."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import hubrt
from gemma3_util import hf_greedy, hf_logits, random_ids, redraw, rel_err
from moe_util import (check_compiled_generation, check_greedy, check_padded_logits, check_xla_cpu_generation,  # noqa: F401
                      check_xla_cpu_logits, copy_with, hr_model, private_plan_cache)

TOL = 1e-4
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
            decoder_sparse_step=1, norm_topk_prob=False, tie_word_embeddings=False, max_position_embeddings=512,
            rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0)
VARIANTS = {
    "top2": {},
    "top1": dict(num_experts_per_tok=1),
    "topE-norm": dict(num_experts_per_tok=8, norm_topk_prob=True),
    "sparse2-mlponly": dict(decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=True),
    "tied-bias": dict(tie_word_embeddings=True, attention_bias=True, num_experts=12, num_experts_per_tok=3),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Checkpoints by name, made once per module."""
    root = tmp_path_factory.mktemp("qwen3moe")
    made = {}

    def get(name, **overrides):
        if name not in made:
            cfg = Qwen3MoeConfig(**{**BASE, **overrides})
            torch.manual_seed(0)
            model = redraw(Qwen3MoeForCausalLM(cfg).eval(), seed=len(made) + 1)
            model.save_pretrained(root / name)
            made[name] = root / name
        return made[name]

    return get










# ---- 1. logits and generation against transformers ---------------------------------------------

@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_f32_match_transformers(ckpts, name):
    path = ckpts(name, **VARIANTS[name])
    ids = random_ids((2, 33), seed=1)
    got = hr_model(path)(ids).logits
    want = hf_logits(path, ids)
    assert got.shape == want.shape == (2, 33, 256)
    assert rel_err(got, want) <= TOL


def test_saved_per_expert_and_layers_as_configured(ckpts):
    """transformers 5 saves each expert's gate/up/down; dense layers keep
    mlp.gate_proj where decoder_sparse_step and mlp_only_layers say so."""
    names = load_file(ckpts("sparse2-mlponly", **VARIANTS["sparse2-mlponly"]) / "model.safetensors").keys()
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names
    assert "model.layers.1.mlp.gate.weight" in names
    assert "model.layers.3.mlp.gate_proj.weight" in names and "model.layers.3.mlp.gate.weight" not in names
    assert "model.layers.0.mlp.gate_proj.weight" in names


def test_stacked_experts_read_as_they_are(ckpts, tmp_path):
    """A checkpoint holding transformers' in-memory stacked experts
    (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]) gives the
    same logits as the per-expert one."""
    src = ckpts("top2")

    def stack(t):
        for il in range(BASE["num_hidden_layers"]):
            p = f"model.layers.{il}.mlp.experts."
            gu = [torch.cat([t.pop(f"{p}{e}.gate_proj.weight"), t.pop(f"{p}{e}.up_proj.weight")]) for e in range(8)]
            t[p + "gate_up_proj"] = torch.stack(gu)
            t[p + "down_proj"] = torch.stack([t.pop(f"{p}{e}.down_proj.weight") for e in range(8)])

    dst = copy_with(src, tmp_path / "stacked", tensors=stack)
    ids = random_ids((1, 19), seed=2)
    np.testing.assert_array_equal(hr_model(dst)(ids).logits, hr_model(src)(ids).logits)


def test_one_expert_takes_every_token(ckpts, tmp_path):
    """A zero router gives every expert the same score: top-1 then sends
    every token to the same expert (the tie order torch's topk keeps) and
    leaves the others empty."""
    def zero_router(t):
        for k in t:
            if k.endswith("mlp.gate.weight"):
                t[k] = torch.zeros_like(t[k])

    dst = copy_with(ckpts("top1", **VARIANTS["top1"]), tmp_path / "one-expert", tensors=zero_router)
    ids = random_ids((2, 21), seed=3)
    assert rel_err(hr_model(dst)(ids).logits, hf_logits(dst, ids)) <= TOL


@pytest.mark.parametrize("name", ["top2", "sparse2-mlponly"])
def test_batch_of_4_with_left_padding(ckpts, name):
    path = ckpts(name, **VARIANTS[name])
    check_padded_logits(path, TOL)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
@pytest.mark.parametrize("name", ["top2", "topE-norm", "tied-bias"])
def test_greedy_generation_matches_transformers(ckpts, name):
    path = ckpts(name, **VARIANTS[name])
    check_greedy(path)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_greedy_batch_with_left_padding(ckpts):
    check_greedy(ckpts("top2"), batch_pads=[0, 2, 5, 8])


# ---- 2. experts implementations ----------------------------------------------------------------

def test_grouped_and_eager_implementations(ckpts):
    """"eager" (transformers' per-expert rounding) and "grouped" (the
    default) give the same bits in f32; transformers' names are read;
    switching drops the compiled plans of the other one."""
    path = ckpts("topE-norm", **VARIANTS["topE-norm"])
    ids = random_ids((2, 17), seed=7)
    model = hr_model(path)
    assert model.experts_implementation == "grouped"
    grouped = model(ids).logits
    model.set_experts_implementation("eager")
    assert model.experts_implementation == "eager"
    np.testing.assert_array_equal(model(ids).logits, grouped)
    for alias in ("grouped_mm", "batched_mm"):
        assert hr_model(path, experts_implementation=alias).experts_implementation == "grouped"
    eager = hr_model(path, experts_implementation="eager")
    assert eager.experts_implementation == "eager"
    with pytest.raises(hubrt.HubrtError, match="experts implementation 'ragged' is not known"):
        model.set_experts_implementation("ragged")
    with pytest.raises(hubrt.HubrtError, match="experts implementation 'nope' is not known"):
        hr_model(path, experts_implementation="nope")


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_bf16_eager_is_nearer_transformers_bf16_than_grouped(ckpts):
    """In bf16 the implementations differ as transformers' loop rounds;
    both agree with transformers' bf16 top-1 on nearly every position."""
    path = ckpts("topE-norm", **VARIANTS["topE-norm"])
    ids = random_ids((4, 32), seed=8)
    want = hf_logits(Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), ids)
    for impl in ("grouped", "eager"):
        got = hr_model(path, dtype="bfloat16", experts_implementation=impl)(ids).logits
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95
        assert rel_err(got, want) < 0.05


# ---- 3. compiled forward ------------------------------------------------------------------------

@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_compiled_generation_and_steps_match_eager(ckpts, private_plan_cache):
    check_compiled_generation(ckpts("sparse2-mlponly", **VARIANTS["sparse2-mlponly"]), TOL, seed=9)


@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_compiled_plans_follow_the_implementation(ckpts, private_plan_cache):
    path = ckpts("top2")
    model = hr_model(path)
    ids = random_ids((1, 9), seed=11)
    a = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=[], cache_implementation="static")
    before = hubrt.compile_stats()["compiles"]
    model.set_experts_implementation("eager")
    b = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert hubrt.compile_stats()["compiles"] > before  # new plans, not the grouped ones
    np.testing.assert_array_equal(a, b)


# ---- 4. xla_cpu ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["top2", "sparse2-mlponly"])
def test_xla_cpu_logits_match_cpu_and_transformers(ckpts, name):
    check_xla_cpu_logits(ckpts(name, **VARIANTS[name]), TOL)


@pytest.mark.slow  # eager xla_cpu compiles each op per new shape
def test_xla_cpu_generation_matches_cpu(ckpts, private_plan_cache):
    check_xla_cpu_generation(ckpts("top2"))


# ---- 5. bad configs and checkpoints -------------------------------------------------------------

@pytest.mark.parametrize("config,message", [
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok is 9, not 1 to num_local_experts \(8\)"),
    ({"num_experts_per_tok": 0}, r"num_experts_per_tok is 0"),
    ({"decoder_sparse_step": 0}, r"decoder_sparse_step is 0, not a positive count"),
    ({"num_local_experts": 6}, r"'model.layers.0.mlp.gate.weight' is \[8, 64\], not the \[6, 64\] computed from "
                               r"num_experts \(6\)"),
    ({"moe_intermediate_size": 16}, r"'model.layers.0.mlp.experts.0.gate_proj.weight' is \[32, 64\], not the "
                                    r"\[16, 64\] computed from 2 x moe_intermediate_size \(32\) / 2"),
    ({"use_sliding_window": True}, r"use_sliding_window is not supported"),
])
def test_bad_config_is_refused_naming_the_field(ckpts, tmp_path, config, message):
    path = copy_with(ckpts("top2"), tmp_path / "bad", config=config)
    with pytest.raises(hubrt.HubrtError, match=message):
        hr_model(path)


def test_missing_expert_is_named(ckpts, tmp_path):
    path = copy_with(ckpts("top2"), tmp_path / "bad",
                     tensors=lambda t: t.pop("model.layers.2.mlp.experts.5.down_proj.weight"))
    with pytest.raises(hubrt.HubrtError, match=r"missing tensor 'model.layers.2.mlp.experts.5.down_proj.weight' "
                                               r"\(nor the stacked 'model.layers.2.mlp.experts.down_proj'\)"):
        hr_model(path)


# ---- 6. the CLI -----------------------------------------------------------------------------------

@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_cli_run_with_each_experts_implementation(tmp_path):
    """hubrt run on a Qwen3-MoE with the real Qwen3 tokenizer: the greedy
    text transformers gives, under --experts grouped and eager; an unknown
    name is refused with exit 2, naming it."""
    import shutil
    import subprocess

    from hubrt_cli_util import CLI, ROOT
    from tokenizers import Tokenizer

    path = tmp_path / "moe-tok"
    cfg = Qwen3MoeConfig(**{**BASE, "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 48,
                            "moe_intermediate_size": 16, "head_dim": 8, "num_hidden_layers": 2})
    torch.manual_seed(0)
    redraw(Qwen3MoeForCausalLM(cfg).eval(), seed=9).save_pretrained(path)
    for f in (ROOT.parent / "shared" / "data" / "tokenizers" / "qwen3").iterdir():
        shutil.copy(f, path / f.name)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    prompt = "Mixture of experts, routed"
    ids = tok.encode(prompt).ids
    out = hf_greedy(path, [ids], 12)
    want = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
    for impl in ("grouped", "eager"):
        r = subprocess.run([CLI, "run", str(path), "-p", prompt, "-n", "12", "--greedy", "--experts", impl],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout == want + "\n"
    r = subprocess.run([CLI, "run", str(path), "-p", prompt, "-n", "2", "--experts", "ragged"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2
    assert "experts implementation 'ragged' is not known" in r.stderr


# ---- 7. GGUF files from llama.cpp's converter -------------------------------------------------------

@pytest.mark.slow  # long under the sanitizers; the main test pass runs it
def test_gguf_from_llama_cpp_converter(tmp_path):
    """A Qwen3-MoE with the real Qwen3 tokenizer, converted by llama.cpp's
    own converter (its *_exps tensors: experts stacked, gate and up apart):
    hubrt's logits from the GGUF equal transformers' on the checkpoint
    (norm_topk_prob true: llama.cpp's qwen3moe graph always renormalises)."""
    from moe_util import converted_qwen3_moe
    cfg = Qwen3MoeConfig(**{**BASE, "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 48,
                            "moe_intermediate_size": 16, "head_dim": 8, "num_hidden_layers": 2,
                            "norm_topk_prob": True, "bos_token_id": 151643, "eos_token_id": 151645,
                            "pad_token_id": None})
    src, gguf = converted_qwen3_moe(tmp_path, cfg, 11, "f32")
    import gguf as gguf_py
    names = {t.name for t in gguf_py.GGUFReader(str(gguf)).tensors}
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
            "blk.0.ffn_gate_inp.weight"} <= names
    ids = np.random.default_rng(0).integers(3, 100000, (2, 23))
    model = hubrt.AutoModelForCausalLM.from_pretrained(gguf, dtype="float32")
    assert model.architecture == "Qwen3MoeForCausalLM"
    assert rel_err(model(ids).logits, hf_logits(src, ids)) <= TOL

