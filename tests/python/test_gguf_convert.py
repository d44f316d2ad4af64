"""GGUF files of the Llama 3, Qwen3 and Gemma 3 families, made from tiny random HF
checkpoints (scripts/make_fixtures.py, with the real llama3 and qwen3
tokenizers) by llama.cpp's own converter (scripts/llama_cpp_convert.py,
from the pinned llama-cpp-python sdist): hubrt's logits from the GGUF
against transformers' on the checkpoint it came from (llama3 rope scaling
arrives as llama.cpp's rope_freqs tensor, linear and yarn as its
rope.scaling keys; Qwen3's q/k norms and unpermuted
q/k; a tied and an untied head; Gemma 3's norms with the 1 folded in, its
window, per-kind rope and llama.cpp's attention scale), and the tokenizer
hubrt builds from the GGUF's metadata against the checkpoint's
tokenizer.json in transformers."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hubrt
from test_gguf import hubrt_tokenizer
from tok_corpus import CORPUS

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
sys.path.insert(0, str(ROOT / "scripts"))
from llama_cpp_convert import convert  # noqa: E402
from fs_util import link_or_copy  # noqa: E402

# fixture -> what its GGUF must hold
MODELS = {
    "tiny-llama3-tok": dict(arch="llama", pre="smaug-bpe", rope_freqs=True),
    "tiny-qwen3-tok": dict(arch="qwen3", pre="qwen2", rope_freqs=False),
    "tiny-gemma3-tok": dict(arch="gemma3", pre=None, rope_freqs=False),
}
# GGUF tokenizers hubrt builds (BPE ones; Gemma's SentencePiece model is not yet)
TOKENIZERS = ["tiny-llama3-tok", "tiny-qwen3-tok"]


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny", "--only", *MODELS],
                   check=True, capture_output=True)
    out = tmp_path_factory.mktemp("gguf")
    files = {}
    for name in MODELS:
        files[name] = out / f"{name}.f32.gguf"
        convert(FIX / name, files[name], "f32")
    return files


def test_files_are_what_the_cases_need(ggufs):
    import gguf
    for name, want in MODELS.items():
        r = gguf.GGUFReader(str(ggufs[name]))
        assert r.fields["general.architecture"].contents() == want["arch"]
        if want["pre"]:
            assert r.fields["tokenizer.ggml.pre"].contents() == want["pre"]
        names = {t.name for t in r.tensors}
        assert ("rope_freqs.weight" in names) == want["rope_freqs"], name
    cfg = json.loads((FIX / "tiny-llama3-tok" / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "llama3" and not cfg["tie_word_embeddings"]


def rel_err(got, want):
    return float(np.abs(got - want).max() / (want.max() - want.min()))


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_transformers_on_the_source_checkpoint(ggufs, name):
    from transformers import AutoModelForCausalLM
    # 40 positions: past the llama3 fixture's original length of 16
    ids = np.random.default_rng(0).integers(3, 100000, (2, 40))
    got = hubrt.AutoModelForCausalLM.from_pretrained(ggufs[name], dtype="float32")(ids).logits
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(FIX / name, dtype=torch.float32).eval()
        want = hf(torch.tensor(ids)).logits.numpy()
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-4


def test_llama3_rope_scaling_changes_the_logits(ggufs, tmp_path):
    """The rope_freqs tensor matters here: the same checkpoint without its
    llama3 scaling gives other logits, so the match above rests on it."""
    from transformers import AutoModelForCausalLM
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in ("model.safetensors", "generation_config.json"):
        link_or_copy(FIX / "tiny-llama3-tok" / f, plain / f)
    cfg = json.loads((FIX / "tiny-llama3-tok" / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    (plain / "config.json").write_text(json.dumps(cfg))
    ids = np.random.default_rng(0).integers(3, 100000, (1, 40))
    got = hubrt.AutoModelForCausalLM.from_pretrained(ggufs["tiny-llama3-tok"], dtype="float32")(ids).logits
    with torch.no_grad():
        unscaled = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()(torch.tensor(ids))
    assert rel_err(got, unscaled.logits.numpy()) > 1e-2


def test_gemma3_gguf_norms_folded_and_local_layers(ggufs):
    """The Gemma 3 file: llama.cpp's converter folded the 1 into every norm
    (stored F32), wrote the window and each kind's theta but no layer
    pattern (llama.cpp's 6 holds: layer 5 is the global one) and no
    attention scale (head_dim's, which the fixture's query_pre_attn_scalar
    equals); hubrt reads the file as the checkpoint it came from, the
    logits matching above. Here: the file holds what that relies on."""
    import gguf
    r = gguf.GGUFReader(str(ggufs["tiny-gemma3-tok"]))
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("gemma3.")}
    assert f["gemma3.attention.sliding_window"] == 8 and "gemma3.attention.sliding_window_pattern" not in f
    assert f["gemma3.rope.freq_base_swa"] == 10000.0 and f["gemma3.rope.scaling.type"] == "linear"
    from safetensors.numpy import load_file
    src = load_file(FIX / "tiny-gemma3-tok" / "model.safetensors")
    norm = {t.name: t for t in r.tensors}["blk.0.post_ffw_norm.weight"]
    np.testing.assert_allclose(np.asarray(norm.data), src["model.layers.0.post_feedforward_layernorm.weight"] + 1,
                               rtol=1e-6)


# rope_parameters llama.cpp's converter writes as rope.scaling.* keys
ROPE_SCALING = {
    "linear": dict(rope_type="linear", factor=4.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, attention_factor=1.25,
                 beta_fast=16.0, beta_slow=2.0),
}


@pytest.mark.parametrize("kind", list(ROPE_SCALING))
def test_rope_scaling_keys_give_the_source_logits(ggufs, tmp_path, kind):
    """The Qwen3 checkpoint with a linear or yarn rope_parameters, through
    llama.cpp's converter: hubrt reads the scaling back from the GGUF's
    keys and gives transformers' logits on the scaled checkpoint, which
    differ from the unscaled one's."""
    import gguf
    from transformers import AutoModelForCausalLM
    base, src = FIX / "tiny-qwen3-tok", tmp_path / kind
    src.mkdir()
    for f in base.iterdir():
        if f.name != "config.json":
            link_or_copy(f, src / f.name)
    cfg = json.loads((base / "config.json").read_text())
    cfg["rope_parameters"] = dict(ROPE_SCALING[kind], rope_theta=cfg["rope_parameters"]["rope_theta"])
    (src / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / f"{kind}.gguf"
    convert(src, path, "f32")
    assert gguf.GGUFReader(str(path)).fields["qwen3.rope.scaling.type"].contents() == kind
    ids = np.random.default_rng(5).integers(3, 100000, (1, 40))
    got = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="float32")(ids).logits
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()(torch.tensor(ids)).logits
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()(torch.tensor(ids)).logits
    assert rel_err(got, want.numpy()) <= 1e-4
    assert rel_err(got, plain.numpy()) > 1e-2


@pytest.mark.parametrize("name", TOKENIZERS)
def test_tokenizer_matches_the_checkpoints(ggufs, name):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(FIX / name)
    ours = hubrt_tokenizer(ggufs[name])
    for text in CORPUS:
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), repr(text)
    # the front end on the file: special tokens and the chat template the converter carried over
    auto = hubrt.AutoTokenizer.from_pretrained(ggufs[name])
    assert auto.chat_template == hf.chat_template
    assert (auto.bos_token_id, auto.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)


def file_ranges(path):
    """The address ranges this process maps `path` at (from /proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) == 6 and head[5].strip() == str(path):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                out.append((lo, hi))
    return out


def test_float_tensors_are_file_views(ggufs, monkeypatch):
    """F32/F16/BF16 tensors asked for at their stored dtype, in HF order
    (Qwen3's q/k are not permuted), are views of the GGUF's file map, as a
    safetensors file's are (every GGUF tensor used to be a copy the loader
    made, never packed): their bytes lie in the file's mapping. A model
    keeps them there with HUBRT_WEIGHTS=mmap, and by default copies them
    (packing the linear ones) into anonymous memory, its logits the same."""
    import torch
    from mem_util import file_rss_kb
    path = ggufs["tiny-qwen3-tok"]
    tensors = hubrt.load_safetensors(path)
    ranges = file_ranges(path)
    assert len(tensors) == 24 and ranges
    for name, t in tensors.items():
        p = torch.from_dlpack(t).data_ptr()
        assert any(lo <= p < hi for lo, hi in ranges), name
    del tensors, t
    import gguf
    header = gguf.GGUFReader(str(path)).data_offset  # the metadata (the tokenizer's arrays)
    ids = np.random.default_rng(2).integers(3, 100000, (1, 12))
    monkeypatch.setenv("HUBRT_WEIGHTS", "mmap")
    model = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    want = model(ids).logits
    del model
    monkeypatch.setenv("HUBRT_WEIGHTS", "copy")
    monkeypatch.setenv("HUBRT_PACK_WEIGHTS", "0")
    model = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    np.testing.assert_array_equal(model(ids).logits, want)
    assert file_rss_kb(path) * 1024 <= header + (64 << 10), (file_rss_kb(path), header)


@pytest.mark.parametrize("name", ["tiny-llama3-tok", "tiny-qwen3-tok"])
def test_quantize_at_load_equals_llama_cpp_q8_0(tmp_path, name):
    """A float checkpoint quantized into Q8_0 while loading (quantize="q8_0")
    holds the blocks llama.cpp's converter writes for --outtype q8_0 (its
    gguf-py quantizer, ggml's reference): the logits of the two are the same
    bits, q/k rows permuted by the converter and an untied head included."""
    import gguf
    path = tmp_path / f"{name}.q8_0.gguf"
    convert(FIX / name, path, "q8_0")
    assert {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors} == {"F32", "Q8_0"}
    ids = np.random.default_rng(0).integers(3, 100000, (2, 40))
    file = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    ours = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32", quantize="q8_0")
    assert ours.weight_types == file.weight_types == ["f32", "q8_0"]
    np.testing.assert_array_equal(ours(ids).logits, file(ids).logits)
    # and near the float model: Q8_0 weights, int8 activations
    plain = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name, dtype="float32")(ids).logits
    assert rel_err(ours(ids).logits, plain) < 0.05
