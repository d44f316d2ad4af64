"""HUBRT_WEIGHTS: a CPU model's weights copied at load out of the
checkpoint's file map into anonymous huge-page memory (copy, the default)
or left as zero-copy views of it (mmap). Both give the same logits (bit for
bit where both read the weights through the same kernels; packed bf16
panels take another summation order than the views, so there within
bf16's rounding); copy leaves no weight pages of the file mapped."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hubrt
from mem_util import file_rss_kb, rollup_kb

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
MODELS = [("tiny-llama", "float32"), ("tiny-llama-tied", "float32"), ("tiny-qwen3-bf16-trained", "bfloat16")]


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)


def logits(path, dtype, ids):
    return hubrt.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)(ids).logits


@pytest.mark.parametrize("name,dtype", MODELS)
def test_copy_matches_mmap(monkeypatch, tmp_path, name, dtype):
    # a private copy of the folder, so that no other test's map of the file counts
    folder = tmp_path / name
    shutil.copytree(FIX / name, folder)
    weights = folder / "model.safetensors"
    ids = np.random.default_rng(0).integers(3, 512, (2, 9))
    monkeypatch.setenv("HUBRT_WEIGHTS", "mmap")
    model = hubrt.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    want = model(ids).logits
    mapped = file_rss_kb(weights)
    assert mapped * 1024 >= weights.stat().st_size // 2
    del model
    monkeypatch.setenv("HUBRT_WEIGHTS", "copy")
    monkeypatch.setenv("HUBRT_PACK_WEIGHTS", "0")  # copied as they are: the same kernels as the views
    model = hubrt.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    got = model(ids).logits
    assert file_rss_kb(weights) <= 8  # the header's page or two
    np.testing.assert_array_equal(got, want)
    del model
    monkeypatch.delenv("HUBRT_WEIGHTS")
    monkeypatch.delenv("HUBRT_PACK_WEIGHTS")
    packed = logits(folder, dtype, ids)  # the default: copied, bf16 linears packed into panels
    assert file_rss_kb(weights) <= 8
    if dtype == "float32":
        np.testing.assert_array_equal(packed, want)
    else:
        # bf16 products summed in another order, rounded to bf16 between layers
        assert np.abs(packed - want).max() <= 0.02 * (want.max() - want.min())
        assert (packed.argmax(-1) == want.argmax(-1)).mean() >= 0.95


def test_bad_mode(monkeypatch):
    monkeypatch.setenv("HUBRT_WEIGHTS", "huge")
    with pytest.raises(Exception, match="HUBRT_WEIGHTS=huge"):
        hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama")


def collapse_supported():
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return "[never]" not in thp and (major, minor) >= (6, 1)


@pytest.mark.skipif(not collapse_supported(), reason="needs THP and MADV_COLLAPSE (Linux 6.1)")
@pytest.mark.parametrize("pack", ["0", "1"])
def test_cast_weights_collapse_into_huge_pages(monkeypatch, tmp_path, pack):
    # An f32 checkpoint loaded as bf16: every weight is a buffer the loader
    # owns, written through 4 KiB pages; the two 4 MiB embedding matrices
    # must end up in huge pages (with packing, lm_head's packed copy, made
    # in huge pages, stands for it), and the logits must not change: read
    # as they are, not at all (the same bytes as the file views of
    # HUBRT_WEIGHTS=mmap), packed, within rounding (the panel route).
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16384, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(tmp_path)
    ids = np.random.default_rng(1).integers(3, 16384, (1, 7))
    monkeypatch.setenv("HUBRT_WEIGHTS", "mmap")
    want = logits(tmp_path, "bfloat16", ids)
    monkeypatch.delenv("HUBRT_WEIGHTS")
    monkeypatch.setenv("HUBRT_PACK_WEIGHTS", pack)
    before = rollup_kb("AnonHugePages")
    model = hubrt.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="bfloat16")
    grown = rollup_kb("AnonHugePages") - before
    assert grown >= 2 * 4096, f"AnonHugePages grew by {grown} kB"
    got = model(ids).logits
    if pack == "0":
        np.testing.assert_array_equal(got, want)
    else:
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.01
        assert (got.argmax(-1) == want.argmax(-1)).sum() >= 6  # of 7: a near-tie may flip
