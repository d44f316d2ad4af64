"""Gemma 3 (Gemma3ForCausalLM, and the text model of
Gemma3ForConditionalGeneration) against transformers 5 in float32 eager
attention, on tiny checkpoints made here (gemma3_util): logits over config
variants (sliding window below the prompt, window 1, layer kinds by
pattern and by explicit layer_types, final logit soft-cap, attention bias,
GQA down to one KV head, head_dim != hidden/heads, query_pre_attn_scalar
!= head_dim, rope per layer kind with linear scaling on global layers,
4.x-style config.json); 300 decode steps through the sliding ring; chunked
prefill across the window; left-padded batches; greedy generation eager
and compiled; xla_cpu; the multimodal checkpoint's text model under both
of its name prefixes; bf16; and the errors for bad checkpoints, in Python
and from the CLI. Logits must agree to max|got - want| <= 1e-4 of want's
span."""
import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig

import hubrt
from fs_util import link_or_copy
from gemma3_util import (BASE, edit_config, edit_tensors, hf_greedy, hf_logits, hf_model, hr_model, model_step,
                         need_xla, random_ids, read_config, redraw, rel_err, save_causal, write_config)

ROOT = Path(__file__).resolve().parents[2]
S, F = "sliding_attention", "full_attention"
TOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """name -> a checkpoint folder, made on first use with save_causal's
    overrides (each name always with the same ones)."""
    root = tmp_path_factory.mktemp("gemma3")
    made = {}

    def get(name, **overrides):
        if name not in made:
            kw = dict(overrides)
            drop = kw.pop("_drop", ())
            path = save_causal(root / name, **kw)
            cfg = read_config(path)
            for key in drop:
                del cfg[key]
            write_config(path, cfg)
            made[name] = (path, overrides)
        assert made[name][1] == overrides, f"checkpoint {name!r} asked for with other settings"
        return made[name][0]

    return get


# ---- 1. logits over config variants -----------------------------------------------------

# On BASE: hidden 64, heads 4 / kv 2 of 16, layers S F S F, window 8, 30 tokens
VARIANTS = {
    "window8": {},
    "all-sliding": dict(num_hidden_layers=3, sliding_window_pattern=6),
    "window1": dict(sliding_window=1),  # each token sees only itself on sliding layers
    "window-over-prompt": dict(sliding_window=48),
    # the explicit list wins over the sliding_window_pattern (2) also in config.json
    "layer-types": dict(num_hidden_layers=5, layer_types=[F, S, S, F, S]),
    "softcap": dict(final_logit_softcapping=2.0),
    "attention-bias": dict(attention_bias=True),
    "kv1": dict(num_key_value_heads=1),
    "mha": dict(num_key_value_heads=4),
    "head-dim-24": dict(head_dim=24, query_pre_attn_scalar=20),  # q is 96 wide, hidden 64
    # not in config.json: the class default, 256, not head_dim
    "qpas-absent": dict(query_pre_attn_scalar=256, _drop=["query_pre_attn_scalar"]),
    "rope-per-kind": dict(rope_parameters={F: dict(rope_type="linear", factor=4.0, rope_theta=20000.0),
                                           S: dict(rope_type="default", rope_theta=500.0)}),
    "untied": dict(tie_word_embeddings=False),
    # stored, and ignored by transformers' Gemma 3 attention
    "attn-softcap-ignored": dict(attn_logit_softcapping=0.5),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_f32_match_transformers(ckpts, name):
    overrides = VARIANTS[name]
    path = ckpts(name, **overrides)
    ids = random_ids((2, 30), seed=1)
    hf = hf_model(path)
    if "layer_types" in overrides:
        assert read_config(path)["sliding_window_pattern"] == 2
        assert hf.config.layer_types == overrides["layer_types"]
    want = hf_logits(hf, ids)
    got = hr_model(path)(ids).logits
    assert got.shape == want.shape == (2, 30, 256)
    assert rel_err(got, want) <= TOL
    if name == "softcap":
        assert np.abs(got).max() <= 2.0 and np.abs(want).max() > 1.9


def test_the_variants_change_the_logits(ckpts):
    """The features the variants turn on move transformers' logits far past
    the bound, so a runtime that ignored one of them fails its variant."""
    ids = random_ids((2, 30), seed=1)
    base = hf_logits(ckpts("window8"), ids)
    for name in ["window1", "window-over-prompt", "softcap", "attention-bias", "rope-per-kind", "qpas-absent"]:
        other = hf_logits(ckpts(name, **VARIANTS[name]), ids)
        assert rel_err(other, base) > 100 * TOL, name
    # the window: the first 8 positions see the same keys either way, later ones do not
    wide = hf_logits(ckpts("window-over-prompt", **VARIANTS["window-over-prompt"]), ids)
    assert rel_err(wide[:, :8], base[:, :8]) < 1e-5
    # the same weights: an attention soft-cap of 0.5 (which would flatten
    # every score) changes nothing in transformers, so hubrt must ignore it too
    capped = hf_logits(ckpts("attn-softcap-ignored", **VARIANTS["attn-softcap-ignored"]), ids)
    np.testing.assert_array_equal(capped, base)


def v4_config(cfg, rope_scaling, thetas=True):
    """cfg (a 5.x config.json) in the 4.x form: no layer_types or
    rope_parameters; rope_theta / rope_local_base_freq / rope_scaling,
    sliding_window_pattern and torch_dtype."""
    old = {k: v for k, v in cfg.items() if k not in ("layer_types", "rope_parameters", "_sliding_window_pattern",
                                                      "dtype")}
    rp = cfg["rope_parameters"]
    if thetas:
        old.update(rope_theta=rp[F]["rope_theta"], rope_local_base_freq=rp[S]["rope_theta"])
    old.update(rope_scaling=rope_scaling, sliding_window_pattern=3, torch_dtype="float32")
    return old


def test_v4_config_json_reads_like_v5(ckpts, tmp_path):
    """A 4.x config.json (rope_theta, rope_local_base_freq, rope_scaling
    linear, sliding_window_pattern 3, torch_dtype) is the 5.x one
    transformers writes: transformers reads both to the same layer kinds
    and ropes, and hubrt gives the same logits for both, transformers'."""
    v5 = ckpts("v5", num_hidden_layers=5, sliding_window_pattern=3,
               rope_parameters={F: dict(rope_type="linear", factor=2.0, rope_theta=50000.0),
                                S: dict(rope_type="default", rope_theta=2000.0)})
    cfg5 = read_config(v5)
    assert cfg5["layer_types"] == [S, S, F, S, S]
    v4 = tmp_path / "v4"
    shutil.copytree(v5, v4)
    write_config(v4, v4_config(cfg5, {"rope_type": "linear", "factor": 2.0}))
    assert "layer_types" not in read_config(v4) and "rope_parameters" not in read_config(v4)
    c4, c5 = AutoConfig.from_pretrained(v4), AutoConfig.from_pretrained(v5)
    assert c4.layer_types == c5.layer_types
    assert {k: {**v, "rope_theta": float(v["rope_theta"])} for k, v in c4.rope_parameters.items()} == \
        c5.rope_parameters
    ids = random_ids((2, 30), seed=4)
    want4, want5 = hf_logits(v4, ids), hf_logits(v5, ids)
    assert rel_err(want4, want5) <= 1e-6
    got4, got5 = hr_model(v4)(ids).logits, hr_model(v5)(ids).logits
    np.testing.assert_array_equal(got4, got5)
    assert rel_err(got4, want4) <= TOL


def test_v4_rope_scaling_by_type_key_is_ignored_as_transformers_does(ckpts, tmp_path):
    """rope_scaling {"type": "linear", "factor": 2} (no rope_type), no
    thetas and no sliding_window_pattern: transformers 5 keeps default
    ropes at 1e6 / 1e4, drops the factor and makes every 6th layer global;
    hubrt must read it the same way."""
    v5 = ckpts("v5-6", num_hidden_layers=6, sliding_window_pattern=3)
    assert read_config(v5)["layer_types"] == [S, S, F] * 2
    legacy = tmp_path / "legacy"
    shutil.copytree(v5, legacy)
    cfg = v4_config(read_config(v5), {"type": "linear", "factor": 2.0}, thetas=False)
    del cfg["sliding_window_pattern"]
    write_config(legacy, cfg)
    c = AutoConfig.from_pretrained(legacy)
    assert c.rope_parameters[F]["rope_type"] == "default" and float(c.rope_parameters[F]["rope_theta"]) == 1e6
    assert float(c.rope_parameters[S]["rope_theta"]) == 1e4
    assert c.layer_types == [S] * 5 + [F]
    # the same written out in the 5.x form, and with the factor applied
    variants = {}
    for name, full in (("plain", dict(rope_type="default", rope_theta=1e6)),
                       ("scaled", dict(rope_type="linear", factor=2.0, rope_theta=1e6))):
        variants[name] = tmp_path / name
        shutil.copytree(v5, variants[name])
        edit_config(variants[name], layer_types=[S] * 5 + [F],
                    rope_parameters={F: full, S: dict(rope_type="default", rope_theta=1e4)})
    ids = random_ids((1, 30), seed=5)
    want = hf_logits(legacy, ids)
    assert rel_err(hf_logits(variants["plain"], ids), want) <= 1e-6
    assert rel_err(hf_logits(variants["scaled"], ids), want) > 100 * TOL  # the factor would show
    assert rel_err(hr_model(legacy)(ids).logits, want) <= TOL


# ---- 2. decoding through the sliding ring --------------------------------------------------

def test_300_decode_steps_match_the_full_forward(ckpts):
    """A 20-token prompt then 300 single-token steps over a cache of 384
    (full layers keep everything, the 32-slot sliding ring wraps ~10
    times): every step's logits are transformers' for that position of one
    forward over the whole sequence."""
    path = ckpts("w32", tie_word_embeddings=False, sliding_window=32)
    ids = random_ids((2, 320), seed=2)
    want = hf_logits(path, ids)
    model = hr_model(path)
    cache = hubrt.KVCache(model, batch=2, max_len=384)
    got = [model(ids[:, :20], past_key_values=cache).logits]
    for t in range(20, 320):
        got.append(model(ids[:, t:t + 1], past_key_values=cache).logits)
    got = np.concatenate(got, axis=1)
    assert got.shape == want.shape
    assert rel_err(got, want) <= TOL
    assert rel_err(got[:, 280:], want[:, 280:]) <= TOL


@pytest.mark.parametrize("name,window,prompt", [("w32", 32, 40), ("gen8", 8, 12)])
def test_greedy_generation_matches_transformers(ckpts, name, window, prompt):
    path = ckpts(name, tie_word_embeddings=False, sliding_window=window)
    ids = random_ids((1, prompt), seed=3)
    got = hr_model(path).generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=[])
    want = hf_greedy(path, ids, 48)
    assert got.shape == (1, prompt + 48)
    assert len(set(want[0, prompt:].tolist())) > 8  # varied text, not one token repeated
    np.testing.assert_array_equal(got, want)


def test_chunked_prefill_across_the_window(ckpts):
    """Chunks longer than the 16-slot ring (24: each overwrites the ring
    whole), one the ring's size, and short ones and single steps after it
    wraps; and generate's own prefill_chunk over a 70-token prompt."""
    path = ckpts("w16", tie_word_embeddings=False, sliding_window=16)
    ids = random_ids((2, 100), seed=6)
    want = hf_logits(path, ids)
    model = hr_model(path)
    cache = hubrt.KVCache(model, batch=2, max_len=128)
    got, at = [], 0
    for n in [24, 24, 22, 16, 3, 1, 1, 9]:
        got.append(model(ids[:, at:at + n], past_key_values=cache).logits)
        at += n
    assert at == 100
    assert rel_err(np.concatenate(got, axis=1), want) <= TOL
    prompt = ids[:1, :70]
    whole = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=[])
    chunked = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=[], prefill_chunk=24)
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_array_equal(whole, hf_greedy(path, prompt, 24))


def test_cache_smaller_than_the_window(ckpts):
    """A cache of 20 slots under a window of 32: sliding layers keep all
    20 (no ring), and the logits are the full forward's."""
    path = ckpts("w32", tie_word_embeddings=False, sliding_window=32)
    ids = random_ids((1, 20), seed=7)
    want = hf_logits(path, ids)
    model = hr_model(path)
    cache = hubrt.KVCache(model, batch=1, max_len=20)
    got = [model(ids[:, :5], past_key_values=cache).logits]
    got += [model(ids[:, t:t + 1], past_key_values=cache).logits for t in range(5, 20)]
    assert rel_err(np.concatenate(got, axis=1), want) <= TOL
    with pytest.raises(hubrt.HubrtError, match="do not fit the KV cache of 20"):
        model(ids[:, :1], past_key_values=cache)


# ---- 3. left padding -------------------------------------------------------------------------

def padded(batch_pads, seq, seed):
    ids = random_ids((len(batch_pads), seq), seed=seed)
    mask = np.ones_like(ids)
    for row, npad in enumerate(batch_pads):
        ids[row, :npad] = 0
        mask[row, :npad] = 0
    return ids, mask


def test_logits_batch_with_left_padding(ckpts):
    """Rows with 0, 5 and 20 pads in 30 slots under a window of 8: the
    window counts slots, pads included, as transformers' mask does."""
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids, mask = padded([0, 5, 20], 30, seed=8)
    want = hf_logits(path, ids, mask)
    got = hr_model(path)(ids, attention_mask=mask).logits
    real = mask.astype(bool)
    assert np.isfinite(got).all()
    assert rel_err(got[real], want[real]) <= TOL


def test_mask_hole_and_offset_positions(ckpts):
    """A mask with a hole mid-row (the window still counts the hole's
    slots, as transformers' does) and position_ids from 100, with and
    without a cache: transformers' logits with the same inputs."""
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids = random_ids((2, 30), seed=20)
    mask = np.ones_like(ids)
    mask[1, 10:14] = 0
    hf = hf_model(path)
    model = hr_model(path)
    real = mask.astype(bool)
    want = hf_logits(hf, ids, mask)
    assert rel_err(model(ids, attention_mask=mask).logits[real], want[real]) <= TOL
    pos = np.broadcast_to(np.arange(100, 130), ids.shape).copy()
    with torch.no_grad():
        want = hf(torch.tensor(ids), position_ids=torch.tensor(pos)).logits.numpy()
    assert rel_err(model(ids, position_ids=pos).logits, want) <= TOL
    cache = hubrt.KVCache(model, batch=2, max_len=32)
    got = [model(ids[:, :12], position_ids=pos[:, :12], past_key_values=cache).logits]
    got += [model(ids[:, t:t + 1], position_ids=pos[:, t:t + 1], past_key_values=cache).logits for t in range(12, 30)]
    assert rel_err(np.concatenate(got, axis=1), want) <= TOL


def test_left_padded_batch_fed_in_chunks_through_the_ring(ckpts):
    """The padded batch through a KV cache in chunks (the mask covering
    cached and new tokens): a first chunk of only pads in one row, chunks
    longer than the 8-slot ring, single steps."""
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids, mask = padded([0, 7, 25], 40, seed=19)
    want = hf_logits(path, ids, mask)
    model = hr_model(path)
    cache = hubrt.KVCache(model, batch=3, max_len=40)
    got, at = [], 0
    for n in [12, 12, 1, 1, 14]:
        got.append(model(ids[:, at:at + n], attention_mask=mask[:, :at + n], past_key_values=cache).logits)
        at += n
    got = np.concatenate(got, axis=1)
    real = mask.astype(bool)
    assert np.isfinite(got).all()
    assert rel_err(got[real], want[real]) <= TOL


def test_greedy_batch_with_left_padding(ckpts):
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids, mask = padded([0, 3, 9, 13], 14, seed=9)
    got = hr_model(path).generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, eos_token_id=[])
    np.testing.assert_array_equal(got, hf_greedy(path, ids, 40, mask=mask))


# ---- 4. compiled forward -----------------------------------------------------------------------

@pytest.fixture
def private_plan_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "plans"))
    hubrt.reset_compile_stats()


def test_static_cache_generation_matches_eager_and_transformers(ckpts, private_plan_cache):
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids = random_ids((1, 37), seed=10)  # prefill buckets 32, 4, 1
    model = hr_model(path)
    eager = model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=[])
    static = model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert hubrt.compile_stats()["compiles"] > 0
    np.testing.assert_array_equal(static, eager)
    np.testing.assert_array_equal(static, hf_greedy(path, ids, 64))
    ids, mask = padded([0, 3, 9], 14, seed=11)
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=[])
    static = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=[],
                            cache_implementation="static")
    np.testing.assert_array_equal(static, eager)
    np.testing.assert_array_equal(static, hf_greedy(path, ids, 30, mask=mask))


@pytest.mark.parametrize("name", ["gen8", "softcap-bias"])
def test_compiled_step_logits_match_eager(ckpts, private_plan_cache, name):
    """hr_model_step compiled and eager, on caches of their own, over a
    37-token prompt (steps of 32, 4, 1) and 40 single tokens with the
    window-8 ring wrapping: both within the bound of transformers'
    logits, and of each other."""
    overrides = dict(tie_word_embeddings=False, sliding_window=8)
    if name == "softcap-bias":
        overrides.update(final_logit_softcapping=3.0, attention_bias=True, num_key_value_heads=1, head_dim=24,
                         query_pre_attn_scalar=20)
    path = ckpts(name, **overrides)
    ids = random_ids((2, 77), seed=12)
    want = hf_logits(path, ids)
    model = hr_model(path)
    caches = {c: hubrt.KVCache(model, batch=2, max_len=96) for c in (False, True)}
    got = {False: [], True: []}
    ends, at = [], 0
    for n in [32, 4, 1] + [1] * 40:
        for compiled in (False, True):
            got[compiled].append(model_step(model, caches[compiled], ids[:, at:at + n], at, compiled))
        at += n
        ends.append(at - 1)
    eager, compiled = np.stack(got[False], 1), np.stack(got[True], 1)
    assert hubrt.compile_stats()["compiles"] == 3  # 32, 4 and the 1-token step
    assert rel_err(eager, want[:, ends]) <= TOL
    assert rel_err(compiled, want[:, ends]) <= TOL
    assert rel_err(compiled, eager) <= 1e-5  # seen: 1e-7 (not bit-equal: other summation orders)


# ---- 5. xla_cpu --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["window8", "layer-types"])
def test_xla_cpu_logits_match_cpu(ckpts, name):
    need_xla()
    path = ckpts(name, **VARIANTS[name])
    ids, mask = padded([0, 11], 30, seed=13)
    want = hr_model(path)(ids, attention_mask=mask).logits
    got = hr_model(path, device_map="xla_cpu")(ids, attention_mask=mask).logits
    real = mask.astype(bool)
    assert rel_err(got[real], want[real]) <= TOL
    assert rel_err(got[real], hf_logits(path, ids, mask)[real]) <= TOL


@pytest.mark.slow  # ~40 s: eager xla_cpu compiles each op per new shape, every step's
def test_xla_cpu_decode_and_generation_match_cpu(ckpts, private_plan_cache):
    need_xla()
    path = ckpts("gen8", tie_word_embeddings=False, sliding_window=8)
    ids = random_ids((1, 40), seed=14)
    want = hf_logits(path, ids)
    model = hr_model(path, device_map="xla_cpu")
    cache = hubrt.KVCache(model, batch=1, max_len=48)
    got = [model(ids[:, :13], past_key_values=cache).logits]
    got += [model(ids[:, t:t + 1], past_key_values=cache).logits for t in range(13, 40)]
    assert rel_err(np.concatenate(got, axis=1), want) <= TOL
    prompt = ids[:, :10]
    cpu = hr_model(path).generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=[])
    for impl in (None, "static"):
        out = model.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=[], cache_implementation=impl)
        np.testing.assert_array_equal(np.asarray(out), cpu)


# ---- 6. Gemma3ForConditionalGeneration's text model ------------------------------------------

def save_multimodal(path, seed=0, **text_overrides):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    text = {**BASE, **text_overrides}
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    torch.manual_seed(seed)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    model = redraw(Gemma3ForConditionalGeneration(cfg).eval(), seed)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    """A multimodal checkpoint whose text config sets a final soft-cap of
    2.0 (which the multimodal class never applies), as saved."""
    path = tmp_path_factory.mktemp("gemma3-mm") / "mm"
    model = save_multimodal(path, seed=3, final_logit_softcapping=2.0, tie_word_embeddings=True)
    return path, model


def test_multimodal_checkpoint_layout(multimodal):
    path, _ = multimodal
    cfg = read_config(path)
    assert cfg["architectures"] == ["Gemma3ForConditionalGeneration"] and "text_config" in cfg
    from safetensors import safe_open
    with safe_open(path / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert "language_model.model.layers.0.self_attn.q_norm.weight" in keys
    assert any(k.startswith("vision_tower.") for k in keys)
    assert any(k.startswith("multi_modal_projector.") for k in keys)
    assert not any(k.startswith("model.") for k in keys)


def test_multimodal_text_logits_match_transformers(multimodal, tmp_path):
    """(a) transformers' Gemma3ForConditionalGeneration with no image, (b) a
    Gemma3ForCausalLM on the same text weights (no soft-cap), and the
    same checkpoint with its text names under 'model.language_model.'."""
    from transformers import Gemma3ForCausalLM
    path, mm = multimodal
    ids = random_ids((2, 30), seed=15)
    with torch.no_grad():
        want_mm = mm(torch.tensor(ids)).logits.numpy()
    loaded = hf_model(path)
    assert type(loaded).__name__ == "Gemma3ForConditionalGeneration"
    assert rel_err(hf_logits(loaded, ids), want_mm) <= 1e-6
    model = hr_model(path)
    assert model.architecture == "Gemma3ForConditionalGeneration"
    got = model(ids).logits
    assert got.shape == want_mm.shape == (2, 30, 256)
    assert np.abs(got).max() > 2.0  # not soft-capped
    assert rel_err(got, want_mm) <= TOL

    text_cfg = copy.deepcopy(mm.config.text_config)
    text_cfg.final_logit_softcapping = None
    causal = Gemma3ForCausalLM(text_cfg).eval()
    state = {k.replace("model.language_model.", "model."): v for k, v in mm.state_dict().items()
             if k.startswith("model.language_model.")}
    missing, unexpected = causal.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    causal.tie_weights()
    want_causal = hf_logits(causal, ids)
    assert rel_err(want_causal, want_mm) <= 1e-6
    assert rel_err(got, want_causal) <= TOL

    inner = tmp_path / "inner-prefix"
    shutil.copytree(path, inner)
    edit_tensors(inner, lambda w: {k.replace("language_model.model.", "model.language_model."): v
                                   for k, v in w.items()})
    assert rel_err(hf_logits(inner, ids), want_mm) <= 1e-6
    np.testing.assert_array_equal(hr_model(inner)(ids).logits, got)


def test_sparse_hub_style_multimodal_config(tmp_path):
    """A Hub 4.x multimodal checkpoint: a text_config holding only what
    differs from Gemma3TextConfig's defaults (no head scale, eps, thetas,
    layer pattern, tie, activation, context), rope_scaling linear,
    torch_dtype, and the vision tower under 'vision_tower.vision_model.'."""
    path = tmp_path / "hub"
    mm = save_multimodal(path, seed=5, num_hidden_layers=7, sliding_window_pattern=6, query_pre_attn_scalar=256,
                         max_position_embeddings=131072,
                         rope_parameters={F: dict(rope_type="linear", factor=2.0, rope_theta=1e6),
                                          S: dict(rope_type="default", rope_theta=1e4)})
    cfg = read_config(path)
    keep = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "sliding_window", "model_type"]
    cfg["text_config"] = {**{k: cfg["text_config"][k] for k in keep},
                          "rope_scaling": {"factor": 2.0, "rope_type": "linear"}}
    cfg["torch_dtype"] = cfg.pop("dtype")
    write_config(path, cfg)
    edit_tensors(path, lambda w: {k.replace("vision_tower.", "vision_tower.vision_model."): v for k, v in w.items()})
    hf = hf_model(path)
    tc = hf.config.text_config
    assert tc.layer_types == [S] * 5 + [F, S] and tc.query_pre_attn_scalar == 256 and tc.tie_word_embeddings
    assert tc.rope_parameters[F]["rope_type"] == "linear"
    ids = random_ids((2, 30), seed=18)
    with torch.no_grad():
        want = mm(torch.tensor(ids)).logits.numpy()
    assert rel_err(hf_logits(hf, ids), want) <= 1e-6
    assert rel_err(hr_model(path)(ids).logits, want) <= TOL


def test_multimodal_greedy_generation(multimodal):
    path, _ = multimodal
    ids = random_ids((1, 12), seed=16)
    got = hr_model(path).generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=[])
    np.testing.assert_array_equal(got, hf_greedy(path, ids, 24))


# ---- 7. bf16 --------------------------------------------------------------------------------------

def test_bf16_checkpoint(ckpts):
    """A bf16 checkpoint: read at float32, transformers' float32 logits of
    the same bf16 weights to the bound; run at bf16, within bf16's
    rounding of transformers' bf16 run."""
    path = ckpts("bf16", dtype=torch.bfloat16, tie_word_embeddings=False, final_logit_softcapping=10.0)
    assert read_config(path)["dtype"] == "bfloat16"
    ids = random_ids((2, 30), seed=17)
    want32 = hf_logits(path, ids)
    assert rel_err(hr_model(path, dtype="float32")(ids).logits, want32) <= TOL
    model = hr_model(path, dtype="auto")
    assert model.dtype == "bf16"
    got = model(ids).logits
    with torch.no_grad():
        want16 = hf_model(path, dtype=torch.bfloat16)(torch.tensor(ids)).logits.float().numpy()
    # seen: 0.5% of the span from either (transformers' bf16 is 0.5% from its f32), top-1 all equal
    assert rel_err(got, want16) < 0.02
    assert rel_err(got, want32) < 0.02
    assert (got.argmax(-1) == want32.argmax(-1)).mean() >= 0.95


# ---- 8. bad checkpoints ---------------------------------------------------------------------------

def cli():
    lib = os.environ.get("HUBRT_LIBRARY")
    exe = Path(lib).parent / "hubrt" if lib else ROOT / "build" / "hubrt"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    return str(exe)


def gemma3_tokenizer():
    d = Path(os.environ.get("HUBRT_SHARED_DIR", ROOT.parent / "shared")) / "data" / "tokenizers" / "gemma3"
    if not (d / "tokenizer.json").exists():
        pytest.skip(f"no Gemma 3 tokenizer at {d}")
    return d


def broken(ckpts, tmp_path, case):
    path = tmp_path / case
    shutil.copytree(ckpts("window8"), path)
    if case == "layer-type":
        edit_config(path, layer_types=[S, "chunked_attention", S, F])
    elif case == "window":
        edit_config(path, sliding_window=1024)
    elif case == "bidirectional":
        edit_config(path, use_bidirectional_attention=True)
    else:
        edit_tensors(path, lambda w: {k: v for k, v in w.items()
                                      if k != "model.layers.0.post_feedforward_layernorm.weight"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        link_or_copy(gemma3_tokenizer() / name, path / name)
    return path


BAD = {
    "layer-type": r"layer_types\[1\] is 'chunked_attention'",
    "window": r"sliding_window 1024 must be in 1\.\.512",
    "norm": r"'model\.layers\.0\.post_feedforward_layernorm\.weight'",
    "bidirectional": r"use_bidirectional_attention",  # EmbeddingGemma's: not a causal LM
}


@pytest.mark.parametrize("case", BAD)
def test_bad_checkpoint_is_refused_in_python(ckpts, tmp_path, case):
    path = broken(ckpts, tmp_path, case)
    with pytest.raises(hubrt.HubrtError, match=BAD[case]):
        hr_model(path)


@pytest.mark.parametrize("case", BAD)
def test_bad_checkpoint_is_refused_by_the_cli(ckpts, tmp_path, case):
    path = broken(ckpts, tmp_path, case)
    r = subprocess.run([cli(), "run", str(path), "-p", "Hello", "-n", "2", "--greedy"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert re.search(BAD[case], r.stderr), r.stderr
