"""Helpers the mixture-of-experts model tests share (test_qwen3_moe.py,
test_gpt_oss.py, test_quant_experts.py): models by path, left-padded
batches, checkpoint copies with a config or tensors changed, a Qwen3-MoE
GGUF file from llama.cpp's converter, and the compiled-steps check."""
import json

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

import hubrt
from gemma3_util import hf_logits, model_step, random_ids, rel_err


def hr_model(path, dtype="float32", device_map="cpu", **kw):
    return hubrt.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map, **kw)


def padded(pads, n, seed):
    """Left-padded rows: row r has pads[r] pad tokens, then n - pads[r] tokens."""
    ids = random_ids((len(pads), n), seed=seed)
    mask = np.ones_like(ids)
    for r, p in enumerate(pads):
        ids[r, :p] = 0
        mask[r, :p] = 0
    return ids, mask


def copy_with(src, dst, config=None, tensors=None):
    """A copy of checkpoint folder src at dst, config.json updated with
    `config`, model.safetensors rewritten by tensors(dict) in place."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = load_file(dst / "model.safetensors")
        tensors(t)
        save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture
def private_plan_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "plans"))
    hubrt.reset_compile_stats()


def check_compiled_steps(path, tol, seed):
    """hr_model_step compiled and eager on caches of their own over a
    45-token prompt (steps 32, 4, 1, then 8 single tokens): both within tol
    of transformers' logits, and within 1e-5 of each other."""
    model = hr_model(path)
    ids = random_ids((2, 45), seed=seed)
    want = hf_logits(path, ids)
    caches = {c: hubrt.KVCache(model, batch=2, max_len=64) for c in (False, True)}
    got = {False: [], True: []}
    ends, at = [], 0
    for n in [32, 4, 1] + [1] * 8:
        for compiled in (False, True):
            got[compiled].append(model_step(model, caches[compiled], ids[:, at:at + n], at, compiled))
        at += n
        ends.append(at - 1)
    eager, compiled = np.stack(got[False], 1), np.stack(got[True], 1)
    assert rel_err(eager, want[:, ends]) <= tol
    assert rel_err(compiled, want[:, ends]) <= tol
    assert rel_err(compiled, eager) <= 1e-5


def check_compiled_generation(path, tol, seed):
    """64 greedy tokens of a left-padded batch (0, 2, 5, 8 pads of 12) with
    the static cache (compiled) equal the eager ones and transformers'; then
    the compiled steps (check_compiled_steps)."""
    from gemma3_util import hf_greedy
    model = hr_model(path)
    ids, mask = padded([0, 2, 5, 8], 12, seed=seed)
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=[])
    static = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=[],
                            cache_implementation="static")
    assert hubrt.compile_stats()["compiles"] > 0
    np.testing.assert_array_equal(static, eager)
    np.testing.assert_array_equal(static, hf_greedy(path, ids, 64, mask=mask))
    check_compiled_steps(path, tol, seed=seed + 1)


def check_padded_logits(path, tol):
    """A batch of 4 left-padded rows (0, 3, 9, 17 pads of 24): the real
    positions' logits within tol of transformers'."""
    ids, mask = padded([0, 3, 9, 17], 24, seed=4)
    got = hr_model(path)(ids, attention_mask=mask).logits
    real = mask.astype(bool)
    assert np.isfinite(got).all()
    assert rel_err(got[real], hf_logits(path, ids, mask)[real]) <= tol


def check_greedy(path, batch_pads=None, n=64):
    """Greedy tokens equal transformers' over n new tokens: one 11-token
    prompt, or left-padded rows of 12 (batch_pads pads each)."""
    from gemma3_util import hf_greedy
    if batch_pads is None:
        ids, mask = random_ids((1, 11), seed=5), None
    else:
        ids, mask = padded(batch_pads, 12, seed=6)
    got = hr_model(path).generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=[])
    np.testing.assert_array_equal(got, hf_greedy(path, ids, n, mask=mask))


def check_xla_cpu_logits(path, tol):
    """The padded batch's logits on xla_cpu within tol of the cpu's and of
    transformers'."""
    from gemma3_util import need_xla
    need_xla()
    ids, mask = padded([0, 3, 9, 17], 24, seed=11)
    want = hr_model(path)(ids, attention_mask=mask).logits
    got = hr_model(path, device_map="xla_cpu")(ids, attention_mask=mask).logits
    real = mask.astype(bool)
    assert rel_err(got[real], want[real]) <= tol
    assert rel_err(got[real], hf_logits(path, ids, mask)[real]) <= tol


def check_xla_cpu_generation(path):
    """64 greedy tokens on xla_cpu, eager and static-cache, equal the cpu's."""
    from gemma3_util import need_xla
    need_xla()
    prompt = random_ids((1, 10), seed=12)
    cpu = hr_model(path).generate(prompt, max_new_tokens=64, do_sample=False, eos_token_id=[])
    model = hr_model(path, device_map="xla_cpu")
    for impl in (None, "static"):
        out = model.generate(prompt, max_new_tokens=64, do_sample=False, eos_token_id=[], cache_implementation=impl)
        np.testing.assert_array_equal(np.asarray(out), cpu)


def converted_qwen3_moe(tmp_path, cfg, seed, outtype):
    """A random Qwen3-MoE of config `cfg` with the real Qwen3 tokenizer,
    saved by transformers and written by llama.cpp's own converter as
    `outtype` (f32, q8_0, ...): (the checkpoint folder, the GGUF path)."""
    import shutil
    import sys

    import torch
    from transformers import Qwen3MoeForCausalLM

    from gemma3_util import redraw
    from hubrt_cli_util import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_cpp_convert import convert

    src = tmp_path / "moe-tok"
    torch.manual_seed(0)
    redraw(Qwen3MoeForCausalLM(cfg).eval(), seed=seed).save_pretrained(src)
    for f in (ROOT.parent / "shared" / "data" / "tokenizers" / "qwen3").iterdir():
        shutil.copy(f, src / f.name)
    gguf = tmp_path / f"moe.{outtype}.gguf"
    convert(src, gguf, outtype)
    return src, gguf
