"""Model logits against transformers (torch 2.13 CPU) on tiny random-weight
checkpoints made by scripts/make_fixtures.py: every architecture and the
awkward variants (untied lm_head, GQA 1/2/7, head_dim 16/24/32, biases,
each rope type, 4.x-style config), f32 and bf16, batches with padding,
KV-cache continuation, and the errors for bad checkpoints."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM as HFModel

import hubrt

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
F32_MODELS = ["tiny-llama", "tiny-llama-tied", "tiny-llama-gqa7", "tiny-llama-bias", "tiny-llama-linear",
              "tiny-llama-dynamic", "tiny-llama-yarn", "tiny-llama-llama3", "tiny-llama-longrope",
              "tiny-llama-v4", "tiny-qwen2", "tiny-qwen3", "tiny-mistral-window"]


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)


def hf_model(name, dtype=torch.float32):
    return HFModel.from_pretrained(FIX / name, dtype=dtype).eval()


def rel_err(got, want):
    return float(np.abs(got - want).max() / (want.max() - want.min()))


def random_ids(shape, vocab=512, seed=0):
    return np.random.default_rng(seed).integers(3, vocab, shape)


@pytest.mark.parametrize("name", F32_MODELS)
def test_logits_f32_match_transformers(name):
    # 40 tokens: past the 32 of the dynamic/longrope/llama3 fixtures' original lengths
    ids = random_ids((2, 40))
    got = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")(ids).logits
    with torch.no_grad():
        want = hf_model(name)(torch.tensor(ids)).logits.numpy()
    assert got.shape == want.shape == (2, 40, 512)
    assert rel_err(got, want) <= 1e-4


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama-gqa7", "tiny-qwen2"])
def test_logits_batch_with_left_padding(name):
    ids = random_ids((3, 17), seed=1)
    mask = np.ones_like(ids)
    for row, npad in enumerate([0, 4, 16]):
        ids[row, :npad] = 0
        mask[row, :npad] = 0
    got = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name)(ids, attention_mask=mask).logits
    with torch.no_grad():
        want = hf_model(name)(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    real = mask.astype(bool)
    assert np.isfinite(got).all()
    assert rel_err(got[real], want[real]) <= 1e-4


def task_ids(batch, seq, seed):
    """Sequences of the task the -trained fixtures learnt (make_fixtures.task_batch)."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 512, (batch, 1))
    step = rng.integers(1, 8, (batch, 1))
    return (start + step * np.arange(seq)) % 512


# bf16 weights mapped zero-copy, and f32 weights cast to bf16 at load
@pytest.mark.parametrize("name,dtype", [("tiny-qwen3-bf16-trained", "auto"), ("tiny-llama-trained", "bfloat16")])
def test_logits_bf16_top1_agreement(name, dtype):
    ids = task_ids(16, 66, seed=5)
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype=dtype)
    assert model.dtype == "bf16"
    got = model(ids).logits
    with torch.no_grad():
        want = hf_model(name, torch.bfloat16)(torch.tensor(ids)).logits.float().numpy()
    # 1,024 positions; the first two of a row cannot know the sequence's
    # step, so the model is as unsure there as a random one
    agree = (got[:, 2:].argmax(-1) == want[:, 2:].argmax(-1)).mean()
    assert agree >= 0.99, agree
    assert rel_err(got, want) < 0.05


def test_v4_config_reads_like_v5():
    ids = random_ids((1, 12))
    a = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama-v4")(ids).logits
    b = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama-llama3")(ids).logits
    np.testing.assert_array_equal(a, b)


def test_dtype_from_config_and_override():
    bf16 = FIX / "tiny-qwen3-bf16-trained"
    assert hubrt.AutoModelForCausalLM.from_pretrained(bf16).dtype == "bf16"
    assert hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama").dtype == "f32"
    assert hubrt.AutoModelForCausalLM.from_pretrained(bf16, dtype="float32").dtype == "f32"
    assert hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama", dtype=torch.bfloat16).dtype == "bf16"
    with pytest.raises(hubrt.HubrtError, match="dtype 'int8'"):
        hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama", dtype="int8")


def test_config_dtype_over_torch_dtype(tmp_path, capfd):
    """A config.json with both keys loads at "dtype", as transformers reads
    it, and says that they disagree; with one key, or both equal, nothing
    is said."""
    from transformers import AutoConfig

    folder = tmp_path / "both"
    shutil.copytree(FIX / "tiny-qwen3-bf16-trained", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("torch_dtype", None)
    for keys, want, warned in (({"dtype": "bfloat16", "torch_dtype": "float16"}, "bf16", True),
                               ({"dtype": "float16", "torch_dtype": "float16"}, "f16", False),
                               ({"torch_dtype": "float16"}, "f16", False)):
        cfg.pop("dtype", None)
        cfg.pop("torch_dtype", None)
        (folder / "config.json").write_text(json.dumps({**cfg, **keys}))
        assert str(AutoConfig.from_pretrained(folder).dtype) == {"bf16": "torch.bfloat16", "f16": "torch.float16"}[want]
        capfd.readouterr()
        assert hubrt.AutoModelForCausalLM.from_pretrained(folder).dtype == want
        err = capfd.readouterr().err
        assert ("dtype 'bfloat16' and torch_dtype 'float16' disagree" in err) == warned, err


def test_kv_cache_continuation_matches_full_forward():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3")
    ids = random_ids((2, 15), seed=3)
    full = model(ids).logits
    cache = hubrt.KVCache(model, batch=2, max_len=32)
    first = model(ids[:, :10], past_key_values=cache).logits
    rest = model(ids[:, 10:], past_key_values=cache).logits
    last = model(ids[:, 14:], past_key_values=hubrt.KVCache(model, 2, 1), position_ids=[[14], [14]]).logits
    assert rel_err(first, full[:, :10]) <= 1e-5
    assert rel_err(rest, full[:, 10:]) <= 1e-5
    assert not np.allclose(last, full[:, 14:])  # no context: a different distribution


def test_prompt_longer_than_cache_is_refused():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama")
    cache = hubrt.KVCache(model, batch=1, max_len=8)
    with pytest.raises(hubrt.HubrtError, match="do not fit the KV cache of 8"):
        model(random_ids((1, 9)), past_key_values=cache)


def test_bad_inputs_are_refused():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama")
    with pytest.raises(hubrt.HubrtError, match="outside the vocabulary of 512"):
        model([[1, 512]])
    with pytest.raises(hubrt.HubrtError, match="attention_mask has shape"):
        model([[1, 2, 3]], attention_mask=[[1, 1]])


def copy_fixture(tmp_path, name="tiny-llama"):
    dst = tmp_path / name
    shutil.copytree(FIX / name, dst)
    return dst


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def drop_tensor(path, name):
    weights = load_file(path / "model.safetensors")
    del weights[name]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


# lm_head.weight: an untied checkpoint must carry its own head
@pytest.mark.parametrize("tensor", ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    path = copy_fixture(tmp_path)
    drop_tensor(path, tensor)
    with pytest.raises(hubrt.HubrtError, match=f"missing tensor '{tensor}'"):
        hubrt.AutoModelForCausalLM.from_pretrained(path)


def test_wrong_shape_is_named(tmp_path):
    path = copy_fixture(tmp_path)
    edit_config(path, intermediate_size=100)
    with pytest.raises(hubrt.HubrtError, match=r"config.json: the checkpoint's tensor "
                                               r"'model.layers.0.mlp.gate_proj.weight' is \[128, 64\], not the "
                                               r"\[100, 64\] computed from intermediate_size \(100\)"):
        hubrt.AutoModelForCausalLM.from_pretrained(path)


def test_unsupported_architecture_lists_supported(tmp_path):
    path = copy_fixture(tmp_path)
    edit_config(path, architectures=["GPT2LMHeadModel"])
    with pytest.raises(hubrt.HubrtError, match="'GPT2LMHeadModel' is not supported; supported: "
                                               ".*LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"):
        hubrt.AutoModelForCausalLM.from_pretrained(path)


def test_missing_config_field_is_named(tmp_path):
    path = copy_fixture(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["hidden_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hubrt.HubrtError, match="hidden_size"):
        hubrt.AutoModelForCausalLM.from_pretrained(path)


def test_unknown_rope_type_is_refused(tmp_path):
    path = copy_fixture(tmp_path)
    edit_config(path, rope_parameters={"rope_type": "su", "rope_theta": 10000.0})
    with pytest.raises(hubrt.HubrtError, match="rope type 'su' is not supported"):
        hubrt.AutoModelForCausalLM.from_pretrained(path)
