"""linear and embedding on block-quantized weights kept in their blocks
(GGUF files written with gguf.GGUFWriter from random blocks, loaded with
hubrt.load_safetensors(quantized=True)), against the `gguf` package's
numpy dequantizer: the weight dequantized, x quantized to int8 per 32
elements as llama.cpp's q8 blocks are (emulated here in float32 numpy),
the products summed in float64. Under every kernel ISA the machine has."""
import numpy as np
import pytest

import hubrt
from cpu_isa import isa  # noqa: F401
from test_gguf_quants import SCALES, random_blocks

TYPES = list(SCALES)


def write_gguf(path, qtype, mats):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    for gg, data in mats.items():
        w.add_tensor(gg, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=TYPES)
def quant(request, tmp_path_factory):
    """(type name, hubrt weight [n, k] in its blocks, its float64 dequantized values)."""
    import gguf
    from gguf.quants import dequantize
    name = request.param
    qtype = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(sum(map(ord, name)) + 7)
    n, k = 40, 512  # 40 rows: two full tiles of 16 and a partial one
    blocks = random_blocks(qtype, n, k, rng)
    path = tmp_path_factory.mktemp("q") / f"{name}.gguf"
    write_gguf(path, qtype, {"blk.0.ffn_down.weight": blocks})
    w = hubrt.load_safetensors(path, quantized=True)["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == name.lower() and list(w.shape) == [n, k]
    assert np.array_equal(w.numpy(raw=True), blocks)
    want = dequantize(blocks, qtype).astype(np.float64).reshape(n, k)
    return name, w, want


def quantize_x(x):
    """int8 values and per-element scales, as hubrt (and llama.cpp) quantize
    activations: per 32 elements d = amax / 127, q = round-half-even(x / d)."""
    x = x.astype(np.float32)
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = (np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint(b * inv), -127, 127)
    return q.reshape(x.shape), np.broadcast_to(d, b.shape).reshape(x.shape)


def check_linear(w, want, x, bias=None):
    out = hubrt.ops.linear(hubrt.from_numpy(x), w, None if bias is None else hubrt.from_numpy(bias)).numpy()
    q, d = quantize_x(x)
    xq = q.astype(np.float64) * d.astype(np.float64)
    ref = xq @ want.T + (0 if bias is None else bias.astype(np.float64))
    # float32 sums of exact integer block products: relative to the sum of
    # the terms' magnitudes
    mag = np.abs(xq) @ np.abs(want).T + 1e-30
    assert out.shape == ref.shape
    assert np.all(np.abs(out - ref) <= 2e-6 * mag + 1e-6 * np.abs(ref)), np.max(np.abs(out - ref) / mag)
    # against x itself: off by at most the int8 rounding, d / 2 per element
    exact = x.astype(np.float64) @ want.T + (0 if bias is None else bias.astype(np.float64))
    bound = (d.astype(np.float64) / 2) @ np.abs(want).T
    assert np.all(np.abs(out - exact) <= bound * (1 + 1e-5) + 2e-6 * mag)
    return out


def test_linear_exact_on_int8_activations(quant, isa):
    """x already int8 with a block maximum of 127: the product is exact up
    to float32 summation."""
    name, w, want = quant
    rng = np.random.default_rng(1)
    x = rng.integers(-127, 128, (3, 512)).astype(np.float32)
    x[:, ::32] = 127  # every block's maximum, so its scale is 1
    out = check_linear(w, want, x)
    ref = x.astype(np.float64) @ want.T
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.max(np.abs(x) @ np.abs(want).T))


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 64])
def test_linear_rows(quant, isa, rows):
    name, w, want = quant
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 512)).astype(np.float32)
    x[:, 32:64] = 0  # an all-zero block: scale 0
    check_linear(w, want, x)


def test_linear_batched_bias_and_dtypes(quant):
    name, w, want = quant
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    check_linear(w, want, x, bias)
    # bf16 activations: their float32 values quantized the same way
    xb = hubrt.from_numpy(x).to(dtype="bf16")
    got = hubrt.ops.linear(xb, w).to(dtype="f32").numpy()
    xv = xb.to(dtype="f32").numpy()
    q, d = quantize_x(xv)
    ref = (q * d).astype(np.float64) @ want.T
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_linear_many_rows_matches_one_by_one(quant):
    """The x-row blocking of a long prefill gives each row what a short
    batch through the same tiles gives it (up to 16 rows may take the
    decode kernel, which adds in another order: within float rounding)."""
    name, w, want = quant
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1200, 512)).astype(np.float32)
    all_rows = hubrt.ops.linear(hubrt.from_numpy(x), w).numpy()
    for i in (0, 760, 1176):
        some = hubrt.ops.linear(hubrt.from_numpy(x[i:i + 24]), w).numpy()
        np.testing.assert_array_equal(all_rows[i:i + 24], some)
        one = hubrt.ops.linear(hubrt.from_numpy(x[i:i + 1]), w).numpy()
        np.testing.assert_allclose(one, all_rows[i:i + 1], rtol=1e-5, atol=1e-5 * np.abs(one).max())


def test_embedding_rows_dequantized(quant):
    name, w, want = quant
    ids = np.array([[0, 39, 7], [7, 1, 0]], dtype=np.int64)
    got = hubrt.ops.embedding(w, hubrt.from_numpy(ids)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want[ids].astype(np.float32))


def test_quantized_views_keep_rows(quant):
    name, w, want = quant
    rows = w.narrow(0, 8, 16)
    x = np.ones((1, 512), np.float32)
    got = hubrt.ops.linear(hubrt.from_numpy(x), rows).numpy()
    np.testing.assert_allclose(got, want[8:24].sum(axis=1)[None], rtol=1e-5, atol=1e-5 * np.abs(want).sum())
    with pytest.raises(hubrt.HubrtError, match="whole rows"):
        w.narrow(1, 0, 32)
    with pytest.raises(hubrt.HubrtError, match="whole rows"):
        w.transpose(0, 1)
    with pytest.raises(TypeError, match="raw=True"):
        w.numpy()


def test_linear_refuses_bad_operands(quant):
    name, w, want = quant
    with pytest.raises(hubrt.HubrtError, match="input features"):
        hubrt.ops.linear(hubrt.from_numpy(np.ones((1, 256), np.float32)), w)
    with pytest.raises(hubrt.HubrtError, match="must be f32, bf16 or f16"):
        hubrt.ops.linear(hubrt.from_numpy(np.ones((1, 512), np.int32)), w)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("src", ["f32", "bf16"])
def test_quantizer_matches_gguf(name, src):
    """hubrt's quantizer gives the blocks gguf-py's (which follows ggml's
    reference quantize_row_*_ref bit for bit) gives: random rows with a zero
    block, a block of one repeated value, exact halves (rounding ties) and
    the extremes at either sign."""
    import gguf
    from gguf.quants import quantize
    rng = np.random.default_rng(sum(map(ord, name + src)))
    x = (rng.standard_normal((5, 256)) * rng.uniform(0.01, 3, (5, 1))).astype(np.float32)
    x[0, :32] = 0
    x[1, 32:64] = 0.75
    # Q8_0's scale is 1 in this block (amax 127): its halves are rounding
    # ties, which the reference rounds away from zero
    x[2, 64:96] = np.arange(32, dtype=np.float32) - 15.5
    x[2, 64] = 127
    x[3, 96:128] = -x[3, 96:128] * 100
    if src == "bf16":
        x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16-exact values
    t = hubrt.from_numpy(x).to(dtype=src) if src != "f32" else hubrt.from_numpy(x)
    got = t.quantize(name.lower())
    want = quantize(x, gguf.GGMLQuantizationType[name])
    assert got.dtype == name.lower() and list(got.shape) == [5, 256]
    np.testing.assert_array_equal(got.numpy(raw=True), want)


def test_quantize_refuses_what_it_cannot():
    with pytest.raises(hubrt.HubrtError, match="multiple of 32"):
        hubrt.from_numpy(np.ones((2, 48), np.float32)).quantize("q8_0")
    with pytest.raises(hubrt.HubrtError, match="q5_1, mxfp4, q4_k, q5_k and q6_k, not q2_k"):
        hubrt.from_numpy(np.ones((2, 256), np.float32)).quantize("q2_k")
    with pytest.raises(hubrt.HubrtError, match="multiple of 256 \\(q4_k's block\\)"):
        hubrt.from_numpy(np.ones((2, 96), np.float32)).quantize("q4_k")
    with pytest.raises(hubrt.HubrtError, match="f32, bf16 or f16"):
        hubrt.from_numpy(np.ones((2, 32), np.int32)).quantize("q8_0")


@pytest.fixture(scope="module")
def fix():
    """The tiny checkpoints these tests load (scripts/make_fixtures.py)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, str(root / "scripts" / "make_fixtures.py"), "tiny", "--only", "tiny-llama",
                    "tiny-llama-gqa7"], check=True, capture_output=True)
    return root / "fixtures"


@pytest.mark.parametrize("q", ["q4_0", "q4_1", "q5_0", "q5_1"])
def test_quantize_at_load_keeps_what_does_not_divide(fix, q):
    """quantize= turns the float matrices whose rows divide into 32-element
    blocks into that type while loading; the others (this checkpoint's
    112-wide q/k/v, gate/up and embedding) stay in the model dtype. The
    logits stay near the float model's. (Q8_0 against llama.cpp's own Q8_0
    file, bit for bit: test_gguf_convert.py.)"""
    ids = np.random.default_rng(3).integers(0, 500, (2, 24))
    plain = hubrt.AutoModelForCausalLM.from_pretrained(fix / "tiny-llama-gqa7", dtype="float32")
    quant = hubrt.AutoModelForCausalLM.from_pretrained(fix / "tiny-llama-gqa7", dtype="float32", quantize=q)
    assert quant.weight_types == ["f32", q]
    a, b = plain(ids).logits, quant(ids).logits
    assert 0 < np.abs(a - b).max() <= 0.1 * (a.max() - a.min())


def test_quantize_at_load_refusals(fix):
    with pytest.raises(hubrt.HubrtError, match="quantize 'q2_k' is not a type hubrt quantizes into"):
        hubrt.AutoModelForCausalLM.from_pretrained(fix / "tiny-llama", quantize="q2_k")
    with pytest.raises(hubrt.HubrtError, match="pick one"):
        hubrt.AutoModelForCausalLM.from_pretrained(fix / "tiny-llama", quantize="q8_0", dequantize=True)


def test_cli_quantize_flag(fix):
    import subprocess
    from hubrt_cli_util import CLI
    r = subprocess.run([CLI, "bench", str(fix / "tiny-llama"), "--prompt-len", "8", "--gen", "4", "--dtype", "f32",
                        "--quantize", "q4_1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout.strip().splitlines()[-1])["weights"] == "f32,q4_1"
    bad = subprocess.run([CLI, "bench", str(fix / "tiny-llama"), "--quantize", "q9"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "quantize 'q9'" in bad.stderr
