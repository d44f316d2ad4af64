"""Tiny Llama and Qwen3 checkpoints on the xla_cpu PJRT device: logits
against transformers, greedy generation token for token (float32), and the
compiled forward replayed on the device."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM as HFModel

import hubrt
from hubrt._lib import HubrtError

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
NAMES = ["tiny-llama", "tiny-qwen3"]


@pytest.fixture(scope="module", autouse=True)
def setup():
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable (pip install xla-cpu-pjrt): {e}")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny", "--only", *NAMES],
                   check=True, capture_output=True)


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name):
    ids = np.random.default_rng(0).integers(3, 512, (2, 12))
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32", device_map="xla_cpu")
    got = model(ids).logits
    with torch.no_grad():
        want = HFModel.from_pretrained(FIX / name, dtype=torch.float32).eval()(torch.tensor(ids)).logits.numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() / (want.max() - want.min()) <= 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_compiled_logits_on_xla_match_eager(name):
    """The compiled forward replays per-op PJRT modules on xla_cpu."""
    ids = np.random.default_rng(2).integers(3, 512, (1, 9))
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32", device_map="xla_cpu")
    eager = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=[])
    static = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=[], cache_implementation="static")
    np.testing.assert_array_equal(static, eager)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_is_token_identical(name):
    ids = np.random.default_rng(1).integers(3, 512, (1, 8))
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32", device_map="xla_cpu")
    got = model.generate(ids, max_new_tokens=8, do_sample=False)
    hf = HFModel.from_pretrained(FIX / name, dtype=torch.float32).eval()
    want = hf.generate(torch.tensor(ids), max_new_tokens=8, do_sample=False).numpy()
    np.testing.assert_array_equal(np.asarray(got), want)
