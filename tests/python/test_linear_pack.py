"""Linear weights packed at load (the default for bf16 checkpoints on CPUs
with AVX2 or more, and for f16 ones without AVX-512 BF16): logits as with
the weights read as they are (HUBRT_WEIGHTS=mmap) and as transformers', the
checkpoint's file pages let go (a tied embedding is read from its packed
copy too), and the fused decode node of compiled plans giving the unfused
plan's tokens. Shapes cross the 64-row panels: hidden 160, intermediate
200, vocab 1000."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hubrt
from cpu_isa import lib, use_isa
from test_weights_anon import file_rss_kb


pytestmark = pytest.mark.skipif(" avx2" not in Path("/proc/cpuinfo").read_text(),
                                reason="packing needs AVX2")


TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module", params=[(False, "bf16"), (True, "bf16"), (False, "f16"), (True, "f16")],
                ids=["untied", "tied", "untied-f16", "tied-f16"])
def checkpoint(request, tmp_path_factory):
    """bf16 checkpoints, and f16 ones (packed where the AVX2 kernel, which
    alone has f16 panels, runs the panel route; read as they are elsewhere)."""
    tied, dtype = request.param
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=160, intermediate_size=200, num_hidden_layers=2,
                      num_attention_heads=5, num_key_value_heads=1, head_dim=32, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg).to(TORCH_DTYPE[dtype])
    path = tmp_path_factory.mktemp("packed") / "model"
    model.save_pretrained(path)
    return path


@pytest.fixture(params=["avx2", "avx512", "amx"])
def packed_isa(request):
    """The panel kernels: AVX2, AVX-512 BF16 and AMX (tiles or their
    emulator), each where the CPU has it."""
    before = use_isa(request.param)
    yield request.param
    lib.hr_cpu_isa_set(before)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_logits_packed_as_unpacked_and_transformers(checkpoint, monkeypatch, packed_isa):
    ids = np.random.default_rng(0).integers(3, 1000, (3, 21))
    got = hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)(ids).logits
    monkeypatch.setenv("HUBRT_WEIGHTS", "mmap")
    plain = hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)(ids).logits
    with torch.no_grad():
        hf = LlamaForCausalLM.from_pretrained(checkpoint, dtype="auto").eval()
        want = hf(torch.tensor(ids)).logits.float().numpy()
    assert rel_err(got, plain) < 0.01
    assert (got.argmax(-1) == plain.argmax(-1)).mean() >= 0.95
    assert rel_err(got, want) < 0.05


def test_file_pages_let_go(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "copy"
    shutil.copytree(checkpoint, folder)
    model = hubrt.AutoModelForCausalLM.from_pretrained(folder)
    ids = np.random.default_rng(1).integers(3, 1000, (2, 9))
    model(ids)
    model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=[])
    # compiled plans bind the weights through buffers of their own
    model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=[], cache_implementation="static")
    assert file_rss_kb(folder / "model.safetensors") <= 8  # the header's page or two


@pytest.mark.parametrize("batch", [3, 9])
def test_fused_decode_node_reads_panels_as_linear(checkpoint, monkeypatch, tmp_path, packed_isa, batch):
    """Fused decode (the default: q/k/v and gate/up in one pass, up to 4
    bf16 rows, 16 f16 ones: 9 takes the AVX2 tile twice), compiled and
    eager, gives HUBRT_FUSE=0's tokens bit for bit: both read the same
    panels in the same order. Random weights make near-ties common, so a
    fused sum off by one rounding would change some of the 24 tokens per
    row."""
    monkeypatch.setenv("HUBRT_CACHE_DIR", str(tmp_path / "cache"))
    ids = np.random.default_rng(2).integers(3, 1000, (batch, 11))
    args = dict(max_new_tokens=24, do_sample=False, eos_token_id=[])
    monkeypatch.delenv("HUBRT_FUSE", raising=False)
    m = hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)
    fused, fused_eager = m.generate(ids, cache_implementation="static", **args), m.generate(ids, **args)
    monkeypatch.setenv("HUBRT_FUSE", "0")
    m = hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)
    plain, plain_eager = m.generate(ids, cache_implementation="static", **args), m.generate(ids, **args)
    np.testing.assert_array_equal(fused, plain)
    np.testing.assert_array_equal(fused_eager, plain_eager)


@pytest.fixture(scope="module")
def f32_and_bf16(tmp_path_factory):
    """One model saved twice: in f32 (transformers' default, as many
    fine-tunes are) and rounded to bf16."""
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=160, intermediate_size=200, num_hidden_layers=2,
                      num_attention_heads=5, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    root = tmp_path_factory.mktemp("cast")
    model.save_pretrained(root / "f32")
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    return root / "f32", root / "bf16"


def test_cast_weights_packed(f32_and_bf16, tmp_path, monkeypatch, capfd, packed_isa):
    """An f32 checkpoint run in bf16: the cast weights get packed copies
    too (they fit in the bytes the cast saved; the loader says so at debug
    level), so the logits are the bf16 checkpoint's bit for bit, and the
    f32 file's pages are let go once cast. HUBRT_PACK_WEIGHTS=0 packs none."""
    f32, bf16 = f32_and_bf16
    folder = tmp_path / "f32"
    shutil.copytree(f32, folder)
    ids = np.random.default_rng(4).integers(3, 1000, (3, 21))
    few = ids[:, :1]
    level = lib.hr_log_get_level()
    lib.hr_log_set_level(0)  # debug
    try:
        capfd.readouterr()
        model = hubrt.AutoModelForCausalLM.from_pretrained(folder, dtype="bfloat16")
        # 7 linears in each of 2 layers, and the tied embedding
        assert "packed 15 cast or dequantized linear weights" in capfd.readouterr().err
        got, got_few = model(ids).logits, model(few).logits
        assert file_rss_kb(folder / "model.safetensors") <= 8  # the header's page or two
        ref = hubrt.AutoModelForCausalLM.from_pretrained(bf16)
        np.testing.assert_array_equal(got, ref(ids).logits)
        np.testing.assert_array_equal(got_few, ref(few).logits)
        monkeypatch.setenv("HUBRT_PACK_WEIGHTS", "0")
        capfd.readouterr()
        plain = hubrt.AutoModelForCausalLM.from_pretrained(folder, dtype="bfloat16")(few).logits
        assert "linear weights" not in capfd.readouterr().err
    finally:
        lib.hr_log_set_level(level)
    assert rel_err(got_few, plain) < 0.01


def test_pack_knob(checkpoint, monkeypatch):
    """HUBRT_PACK_WEIGHTS=0 copies the weights as they are: the logits are
    then the plain copy's (HUBRT_WEIGHTS=mmap reads the same bytes), bit for
    bit; a value other than 0 or 1 is an error naming the variable."""
    ids = np.random.default_rng(3).integers(3, 1000, (2, 13))
    monkeypatch.setenv("HUBRT_PACK_WEIGHTS", "0")
    plain = hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)(ids).logits
    monkeypatch.setenv("HUBRT_WEIGHTS", "mmap")
    np.testing.assert_array_equal(hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)(ids).logits, plain)
    monkeypatch.setenv("HUBRT_PACK_WEIGHTS", "yes")
    with pytest.raises(Exception, match="HUBRT_PACK_WEIGHTS=yes"):
        hubrt.AutoModelForCausalLM.from_pretrained(checkpoint)
