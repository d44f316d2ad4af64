"""`hubrt quantize` / hubrt.save_gguf: model folders written as GGUF files,
held against llama.cpp's own code from the pinned llama-cpp-python sdist:

- its converter (convert_hf_to_gguf.py) on the same folders: every metadata
  key it writes (but the descriptive general.name / size_label) and every
  tensor, byte for byte, in f32, f16, bf16 and q8_0; Llama 3 (untied,
  llama3 rope as a rope_freqs tensor, q/k rows permuted), Qwen3 (tied, q/k
  norms), a Llama with q/k/v/o biases (permuted too), linear and yarn rope
  scaling, Qwen2 with biases;
- ggml's reference quantizers (libggml-base, scripts/ggml_ref.py):
  hubrt's blocks of every type it makes equal ggml_quantize_chunk's on
  hostile value sets, and each matrix of a q4_k / q5_k / q6_k file equals
  ggml's quantization of the converter's f32 tensor;
- ggml's GGUF reader (gguf_init_from_file) opens every file written here.

The files load back into hubrt (logits equal to quantizing the folder at
load) and their tokenizer is id-identical to transformers' on the test
corpus. Checkpoints are random (every parameter of rank <= 1 perturbed),
made here with transformers, with the real tokenizers."""
import ctypes
import json
import os
import shutil
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
CLI = Path(os.environ.get("HUBRT_LIBRARY", ROOT / "build" / "libhubrt.so")).parent / "hubrt"
sys.path.insert(0, str(ROOT / "scripts"))
from ggml_ref import library  # noqa: E402
from llama_cpp_convert import convert  # noqa: E402

# ggml's type numbers
GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
        "q6_k": 14, "bf16": 30, "mxfp4": 39}
BLOCKS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k", "q5_k", "q6_k"]
# keys that describe rather than define the model (the converter derives them from the folder's name and size)
DESCRIPTIVE = {"general.name", "general.size_label", "general.basename", "general.finetune", "general.version"}


@pytest.fixture(scope="module")
def ggml():
    lib = ctypes.CDLL(str(library()))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, Params]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    for f, res in [("gguf_get_n_tensors", ctypes.c_int64), ("gguf_get_n_kv", ctypes.c_int64)]:
        getattr(lib, f).restype = res
        getattr(lib, f).argtypes = [ctypes.c_void_p]
    lib.gguf_get_tensor_name.restype = ctypes.c_char_p
    lib.gguf_get_tensor_name.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_type.restype = ctypes.c_int
    lib.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_offset.restype = ctypes.c_size_t
    lib.gguf_get_tensor_offset.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_data_offset.restype = ctypes.c_size_t
    lib.gguf_get_data_offset.argtypes = [ctypes.c_void_p]
    lib.gguf_get_tensor_ne.restype = ctypes.POINTER(ctypes.c_int64)
    lib.gguf_get_tensor_size.restype = ctypes.c_size_t
    lib.gguf_get_key.restype = lib.gguf_get_val_str.restype = ctypes.c_char_p
    lib.gguf_get_arr_str.restype = ctypes.c_char_p
    lib.gguf_get_arr_str.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]
    lib.gguf_get_arr_n.restype = ctypes.c_size_t
    lib.gguf_get_arr_data.restype = lib.gguf_get_val_data.restype = ctypes.c_void_p
    for f in ("gguf_get_tensor_ne", "gguf_get_tensor_size", "gguf_get_key", "gguf_get_kv_type", "gguf_get_arr_type",
              "gguf_get_arr_n", "gguf_get_arr_data", "gguf_get_val_data", "gguf_get_val_str"):
        getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.Params = Params
    return lib


# gguf_type -> numpy scalar type (8: string, 9: array)
GGUF_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
           10: np.uint64, 11: np.int64, 12: np.float64}


def read(lib, path):
    """A GGUF file as ggml's own reader sees it: {key: value} (arrays as
    lists) and {tensor name: (ggml type, ne, bytes)}."""
    ctx = lib.gguf_init_from_file(os.fsencode(path), lib.Params(True, None))
    assert ctx, f"ggml could not read {path}"
    try:
        kv = {}
        for i in range(lib.gguf_get_n_kv(ctx)):
            key, ty = lib.gguf_get_key(ctx, i).decode(), lib.gguf_get_kv_type(ctx, i)
            if ty == 8:
                kv[key] = lib.gguf_get_val_str(ctx, i).decode()
            elif ty == 9:
                at, n = lib.gguf_get_arr_type(ctx, i), lib.gguf_get_arr_n(ctx, i)
                if at == 8:
                    kv[key] = [lib.gguf_get_arr_str(ctx, i, k) for k in range(n)]
                else:
                    dt = np.dtype(GGUF_NP[at])
                    kv[key] = np.frombuffer(ctypes.string_at(lib.gguf_get_arr_data(ctx, i), n * dt.itemsize), dt).tolist()
            else:
                dt = np.dtype(GGUF_NP[ty])
                kv[key] = np.frombuffer(ctypes.string_at(lib.gguf_get_val_data(ctx, i), dt.itemsize), dt)[0].item()
        data = np.memmap(path, np.uint8, mode="r")
        base, tensors = lib.gguf_get_data_offset(ctx), {}
        for i in range(lib.gguf_get_n_tensors(ctx)):
            ne = tuple(lib.gguf_get_tensor_ne(ctx, i)[:4])
            off, size = base + lib.gguf_get_tensor_offset(ctx, i), lib.gguf_get_tensor_size(ctx, i)
            tensors[lib.gguf_get_tensor_name(ctx, i).decode()] = (lib.gguf_get_tensor_type(ctx, i), ne,
                                                                   np.array(data[off:off + size]))
        return kv, tensors
    finally:
        lib.gguf_free(ctx)


def ggml_quantize(lib, qtype, x):
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = x.shape
    out = np.zeros(rows * lib.ggml_row_size(GGML[qtype], cols), np.uint8)
    lib.ggml_quantize_chunk(GGML[qtype], x.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    return out


def hostile_rows(seed, cols=512):
    """Rows that stress each quantizer's search: plain normal, heavy tails,
    all zero, constant, one sign only, an outlier per block, tiny and huge
    magnitudes, bf16-exact values, a ramp with exact ties."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(cols), rng.standard_t(2, cols), np.zeros(cols), np.full(cols, 0.37),
            np.abs(rng.standard_normal(cols)), -np.abs(rng.standard_normal(cols)) * 3,
            rng.standard_normal(cols) * 1e-20, rng.standard_normal(cols) * 3e4,
            np.where(np.arange(cols) % 32 == 5, 50.0, rng.standard_normal(cols) * 0.01),
            np.linspace(-1, 1, cols), np.round(rng.standard_normal(cols) * 4) / 4]
    x = np.stack(rows).astype(np.float32)
    x[-2] = (x[-2].view(np.uint32) & 0xFFFF0000).view(np.float32)
    return x


@pytest.mark.parametrize("qtype", BLOCKS)
def test_blocks_equal_ggml_reference_quantizer(ggml, qtype):
    for seed in range(4):
        x = hostile_rows(seed)
        got = hubrt.from_numpy(x).quantize(qtype).numpy(raw=True).reshape(-1)
        np.testing.assert_array_equal(got, ggml_quantize(ggml, qtype, x), err_msg=f"{qtype} seed {seed}")


def save_model(path, cls_name, tok_from, seed=0, dtype=torch.bfloat16, **cfg):
    """A random checkpoint of transformers' class with the tokenizer files of
    fixture `tok_from`, every parameter of rank <= 1 drawn N(1, 0.1) or
    N(0, 0.1)."""
    import transformers
    torch.manual_seed(seed)
    config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    model = getattr(transformers, cls_name)(config_cls(**cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() <= 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIX / tok_from / f, path / f)
    return path


def ensure_fixtures():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny", "--only", "tiny-llama3-tok",
                    "tiny-qwen3-tok"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders by name: the tiny Llama 3 and Qwen3 fixtures, and models made
    here: 256 wide (k-quant blocks divide the rows), a Llama with attention
    biases, a Qwen2 with biases, linear and yarn rope scaling."""
    ensure_fixtures()
    base = tmp_path_factory.mktemp("models")
    qwen = dict(vocab_size=151936, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                tie_word_embeddings=True)
    llama = dict(vocab_size=128256, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, attention_bias=True,
                 tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)
    m = {"llama3": FIX / "tiny-llama3-tok", "qwen3": FIX / "tiny-qwen3-tok",
         "qwen3-256": save_model(base / "qwen3-256", "Qwen3ForCausalLM", "tiny-qwen3-tok", **qwen),
         "llama-bias-256": save_model(base / "llama-bias-256", "LlamaForCausalLM", "tiny-llama3-tok", seed=1, **llama),
         "qwen2-256": save_model(base / "qwen2-256", "Qwen2ForCausalLM", "tiny-qwen3-tok", seed=2,
                                 dtype=torch.float32, **{**qwen, "tie_word_embeddings": False})}
    for kind, rope in {"linear": dict(rope_type="linear", factor=4.0),
                       "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                    attention_factor=1.25, beta_fast=16.0, beta_slow=2.0)}.items():
        d = base / f"qwen3-{kind}"
        shutil.copytree(FIX / "tiny-qwen3-tok", d)
        cfg = json.loads((d / "config.json").read_text())
        cfg["rope_parameters"] = {**rope, "rope_theta": cfg["rope_parameters"]["rope_theta"]}
        (d / "config.json").write_text(json.dumps(cfg))
        m[f"qwen3-{kind}"] = d
    return m


@pytest.fixture(scope="module")
def written(models, tmp_path_factory):
    """(model, type) -> (hubrt's file, the converter's file), made on demand."""
    out = tmp_path_factory.mktemp("gguf")
    cache = {}

    def get(name, qtype, converter=True):
        if (name, qtype) not in cache:
            mine = out / f"{name}.{qtype}.hubrt.gguf"
            hubrt.save_gguf(models[name], mine, qtype)
            ref = None
            if converter:
                ref = out / f"{name}.{qtype}.llama.gguf"
                convert(models[name], ref, qtype)
            cache[name, qtype] = (mine, ref)
        return cache[name, qtype]
    return get


CONVERTER_CASES = [("llama3", "f32"), ("qwen3", "q8_0"), ("llama-bias-256", "f32"), ("qwen2-256", "bf16"),
                   *[pytest.param(*c, marks=pytest.mark.slow) for c in
                     [("llama3", "q8_0"), ("llama3", "f16"), ("qwen3-linear", "f32"), ("qwen3-yarn", "f32")]]]


@pytest.mark.parametrize("name,qtype", CONVERTER_CASES)
def test_file_equals_llama_cpp_converter(written, ggml, name, qtype):
    mine, ref = written(name, qtype)
    fm, tm = read(ggml, mine)
    fr, tr = read(ggml, ref)
    for k, v in fr.items():
        if k in DESCRIPTIVE:
            continue
        assert k in fm, f"missing key {k}"
        if k == "tokenizer.ggml.pre" and v == "smaug-bpe":
            # the converter names Llama 3's tokenizer by a hash; it ignores merges, which llama.cpp does for this name
            assert fm[k] == "llama-bpe"
            continue
        assert fm[k] == v, k
    # beyond the converter's: the vocabulary size and rotary dims, which llama.cpp reads when present
    arch = fr["general.architecture"]
    assert set(fm) - set(fr) <= {f"{arch}.vocab_size", f"{arch}.rope.dimension_count", "general.name"}
    assert set(tm) == set(tr)
    for n, (ty, ne, raw) in tr.items():
        assert tm[n][:2] == (ty, ne), n
        np.testing.assert_array_equal(tm[n][2], raw, err_msg=n)


@pytest.mark.parametrize("qtype", ["q4_k", "q5_k", "q6_k", "q4_0", "q5_1", "mxfp4"])
def test_quantized_matrices_equal_ggml_on_the_converted_values(written, ggml, qtype):
    """Each matrix of hubrt's file is ggml's quantization of the same tensor
    in the converter's f32 file (q/k rows and biases already in llama.cpp's
    order); vectors stay f32."""
    mine, _ = written("llama-bias-256", qtype, converter=False)
    _, ref = written("llama-bias-256", "f32")
    _, tm = read(ggml, mine)
    _, tr = read(ggml, ref)
    assert set(tm) == set(tr)
    for n, (ty, ne, raw) in tm.items():
        src = tr[n][2].view(np.float32).reshape(ne[1], ne[0])
        if ne[1] == 1:
            assert ty == GGML["f32"], n
            np.testing.assert_array_equal(raw, tr[n][2], err_msg=n)
            continue
        assert ty == GGML[qtype], n
        np.testing.assert_array_equal(raw, ggml_quantize(ggml, qtype, src), err_msg=n)


def test_rows_that_do_not_divide_take_llama_quantize_fallback(written, ggml):
    """The tiny Qwen3 is 32 wide (the k-quants need 256): its matrices fall
    back as llama-quantize's do (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0)."""
    for qtype, want in [("q4_k", "q5_0"), ("q6_k", "q8_0"), ("q5_k", "q5_1")]:
        f, t = read(ggml, written("qwen3", qtype, converter=False)[0])
        assert {ty for ty, ne, _ in t.values() if ne[1] > 1} == {GGML[want]}, qtype
        assert f["general.file_type"] == {"q4_k": 14, "q5_k": 16, "q6_k": 18}[qtype]


@pytest.mark.parametrize("name,qtype", [("qwen3-256", "q4_k"), ("llama-bias-256", "q5_k"), ("qwen3", "q8_0"),
                                        ("llama3", "q4_0")])
def test_file_loads_back_as_the_folder_quantized_at_load(written, models, name, qtype):
    """hubrt on the written file == hubrt on the folder with quantize= at
    load (the same blocks, the same kernels), logits bit for bit."""
    mine, _ = written(name, qtype, converter=False)
    ids = np.random.default_rng(0).integers(3, 100000, (2, 24))
    got = hubrt.AutoModelForCausalLM.from_pretrained(mine, dtype="float32")(ids).logits
    want = hubrt.AutoModelForCausalLM.from_pretrained(models[name], dtype="float32", quantize=qtype)(ids).logits
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_tokenizer_from_the_file_matches_transformers(written, models, name):
    from transformers import AutoTokenizer
    mine, _ = written(name, "q8_0", converter=False)
    hf = AutoTokenizer.from_pretrained(models[name])
    ours = hubrt_tokenizer(mine)
    for text in CORPUS:
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), repr(text)
    auto = hubrt.AutoTokenizer.from_pretrained(mine)
    assert auto.chat_template == hf.chat_template
    assert (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id) == (hf.bos_token_id, hf.eos_token_id,
                                                                         hf.pad_token_id)


def cli(*args):
    p = subprocess.run([str(CLI), "quantize", *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def test_cli_writes_and_reports(models, ggml, tmp_path):
    out = tmp_path / "q.gguf"
    rc, err = cli(models["qwen3"], out, "--type", "q4_0")
    assert rc == 0 and "wrote" in err and "peak RSS" in err
    f, _ = read(ggml, out)
    assert f["general.file_type"] == 2
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_refuses_by_name_and_keeps_what_was_there(models, tmp_path):
    out = tmp_path / "keep.gguf"
    out.write_bytes(b"before")
    rc, err = cli(models["qwen3"], out, "--type", "q2_k")
    assert rc == 2 and "type 'q2_k'" in err
    rc, err = cli(FIX / "tiny-gemma3-tok", out)
    assert rc == 2 and "Gemma3ForCausalLM" in err and "Llama, Mistral, Qwen2 and Qwen3" in err
    notok = tmp_path / "notok"
    shutil.copytree(models["qwen3"], notok)
    (notok / "tokenizer.json").unlink()
    rc, err = cli(notok, out)
    assert rc == 2 and "tokenizer.json" in err
    for bad_id in (1e300, -1, 0.5, 10 ** 7):
        (notok / "tokenizer.json").write_text(json.dumps({**json.loads((models["qwen3"] / "tokenizer.json").read_text()),
                                                          "added_tokens": [{"id": bad_id, "content": "<x>"}]}))
        rc, err = cli(notok, out)
        assert rc == 2 and "not a whole number below the model's 151936 rows" in err, bad_id
    extra = tmp_path / "extra"
    shutil.copytree(models["qwen3"], extra)
    from safetensors.numpy import load_file, save_file
    t = load_file(extra / "model.safetensors")
    t["model.layers.0.mlp.mystery.weight"] = np.zeros((4, 32), np.float32)
    save_file(t, extra / "model.safetensors")
    rc, err = cli(extra, out)
    assert rc == 2 and "model.layers.0.mlp.mystery.weight" in err
    del t["model.layers.0.mlp.mystery.weight"]
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].astype(np.int32)
    save_file(t, extra / "model.safetensors")
    rc, err = cli(extra, out)
    assert rc == 2 and "'model.layers.0.mlp.up_proj.weight' is i32" in err, err
    rc, err = cli(models["qwen3"], tmp_path / "no" / "such" / "dir.gguf")
    assert rc == 2 and "cannot create" in err
    assert out.read_bytes() == b"before" and not list(tmp_path.glob("*.tmp*"))
