"""generate against transformers: greedy f32 token-identical over 64 new
tokens at batch 1 and batch 4 with left padding, eos and padding of
finished rows, repetition penalty; seeded sampling reproducible; errors;
and the `hubrt run` / `hubrt bench` commands on a tokenizer-paired model."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM as HFModel

import hubrt

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)


def hf_model(name):
    m = HFModel.from_pretrained(FIX / name, dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None  # all 64 tokens, unless a test sets one
    return m


def padded_batch(seed=1):
    ids = np.random.default_rng(seed).integers(3, 512, (4, 12))
    mask = np.ones_like(ids)
    for row, npad in enumerate([0, 3, 5, 11]):
        ids[row, :npad] = 0
        mask[row, :npad] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-llama-gqa7", "tiny-llama-tied",
                                  "tiny-mistral-window"])
def test_greedy_batch1_matches_transformers(name):
    ids = np.random.default_rng(0).integers(3, 512, (1, 9))
    got = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name).generate(ids, max_new_tokens=64, eos_token_id=[])
    want = hf_model(name).generate(torch.tensor(ids), max_new_tokens=64, do_sample=False).numpy()
    assert got.shape == (1, 73)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama", "tiny-llama-dynamic", "tiny-mistral-window"])
def test_greedy_batch4_left_padding_matches_transformers(name):
    ids, mask = padded_batch()
    got = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name).generate(
        ids, attention_mask=mask, max_new_tokens=64, eos_token_id=[])
    want = hf_model(name).generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=64,
                                   do_sample=False).numpy()
    np.testing.assert_array_equal(got, want)


def test_chunked_prefill_gives_the_same_tokens():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama-gqa7")
    ids, mask = padded_batch(seed=4)
    whole, stats = model.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[], return_stats=True)
    for chunk in (1, 5):
        got = model.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[], prefill_chunk=chunk)
        np.testing.assert_array_equal(got, whole)
    assert stats["prompt_tokens"] == 12 and stats["new_tokens"] == 16
    # the spans in process CPU time too (what a busy machine's benchmark reads)
    assert stats["prefill_cpu_s"] > 0 and stats["decode_cpu_s"] > 0


def test_eos_stops_rows_and_pads_them_like_transformers():
    name = "tiny-qwen3"
    ids, mask = padded_batch(seed=2)
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    eos = int(free[1, 12 + 4])  # row 1 stops after 5 new tokens
    got = model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    want = hf_model(name).generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=12,
                                   do_sample=False, eos_token_id=eos, pad_token_id=0).numpy()
    np.testing.assert_array_equal(got, want)
    assert (got[1, 12 + 5:] == 0).all()


def test_eos_ends_generation_at_that_token():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama")
    assert model.generation_config["eos_token_id"] == [2]
    ids = np.random.default_rng(0).integers(3, 512, (1, 5))
    free = model.generate(ids, max_new_tokens=8, eos_token_id=[])
    assert free.shape == (1, 13)
    # a model whose eos is the 3rd token it picks stops there
    out = model.generate(ids, max_new_tokens=8, eos_token_id=[int(free[0, 7])])
    np.testing.assert_array_equal(out, free[:, :8])


def test_repetition_penalty_matches_transformers():
    name = "tiny-llama"
    ids = np.random.default_rng(3).integers(3, 512, (1, 6))
    got = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name).generate(
        ids, max_new_tokens=32, repetition_penalty=1.5, eos_token_id=[])
    want = hf_model(name).generate(torch.tensor(ids), max_new_tokens=32, do_sample=False,
                                   repetition_penalty=1.5).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_low_precision_generate_picks_from_the_forward_logits(dtype, penalty):
    """A bf16 or f16 model's generate reads its head's output as it is
    (greedy: the argmax over the row in that dtype; with a processor: the
    row widened): the same tokens as greedy decoding, step by step, over
    the model's own f32 logits with transformers' repetition penalty."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3-bf16-trained", dtype=dtype)
    ids = np.random.default_rng(5).integers(3, 512, (4, 7))
    n = 24
    got = model.generate(ids, max_new_tokens=n, repetition_penalty=penalty, eos_token_id=[])
    cache, seq, step_ids = hubrt.KVCache(model, 4, 7 + n), ids, ids
    proc = RepetitionPenaltyLogitsProcessor(penalty)
    for _ in range(n):
        logits = torch.from_numpy(model(step_ids, past_key_values=cache, logits_to_keep=1).logits[:, -1])
        if penalty != 1.0:
            logits = proc(torch.from_numpy(seq), logits)
        step_ids = logits.argmax(-1).numpy()[:, None]
        seq = np.concatenate([seq, step_ids], 1)
    np.testing.assert_array_equal(got, seq)


def test_seeded_sampling_is_reproducible():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3")
    ids, mask = padded_batch()
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=1.5, top_k=100, top_p=0.95,
              min_p=0.01, eos_token_id=[])
    a = model.generate(ids, seed=7, **kw)
    b = model.generate(ids, seed=7, **kw)
    c = model.generate(ids, seed=8, **kw)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    assert (a != greedy).any()
    # top_k=1 leaves one candidate: sampling is greedy
    one = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=True, top_k=1, seed=3,
                         eos_token_id=[])
    np.testing.assert_array_equal(one, greedy)


def test_torch_in_torch_out():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen2")
    out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, eos_token_id=[])
    assert isinstance(out, torch.Tensor) and out.shape == (1, 6)
    assert out[0, :3].tolist() == [5, 6, 7]


def test_generate_errors():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-llama")
    with pytest.raises(hubrt.HubrtError, match="max_new_tokens must be >= 1"):
        model.generate([[1, 2, 3]], max_new_tokens=0)
    with pytest.raises(hubrt.HubrtError, match="pad on the left"):
        model.generate([[1, 2, 3]], attention_mask=[[1, 1, 0]], max_new_tokens=2)
    with pytest.raises(hubrt.HubrtError, match="batch 65 outside 1..64"):
        model.generate(np.ones((65, 2), dtype=np.int64), max_new_tokens=1)
    with pytest.raises(hubrt.HubrtError, match="top_p"):
        model.generate([[1, 2]], max_new_tokens=1, do_sample=True, top_p=2.0)


def test_batch_64_runs():
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / "tiny-qwen3")
    ids = np.random.default_rng(4).integers(3, 512, (64, 5))
    out = model.generate(ids, max_new_tokens=3, eos_token_id=[])
    single = model.generate(ids[17:18], max_new_tokens=3, eos_token_id=[])
    assert out.shape == (64, 8)
    np.testing.assert_array_equal(out[17:18], single)


# ---- the CLI ---------------------------------------------------------------

def cli():
    lib = os.environ.get("HUBRT_LIBRARY")
    exe = Path(lib).parent / "hubrt" if lib else ROOT / "build" / "hubrt"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    return str(exe)


TOK_MODEL = FIX / "tiny-qwen3-tok"
PROMPT = "The quick brown fox"


def run_cli(*args):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_run_streams_the_greedy_text():
    tok = Tokenizer.from_file(str(TOK_MODEL / "tokenizer.json"))
    ids = tok.encode(PROMPT).ids
    model = hubrt.AutoModelForCausalLM.from_pretrained(TOK_MODEL)
    out = model.generate([ids], max_new_tokens=12)
    want = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
    r = run_cli("run", TOK_MODEL, "-p", PROMPT, "-n", 12, "--greedy")
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n"
    assert re.fullmatch(r"prompt tokens: %d, generated tokens: \d+, prefill: [\d.]+ tok/s, decode: [\d.]+ tok/s, "
                        r"weights: [a-z0-9_,]+\n" % len(ids), r.stderr)


def test_run_stop_string_ends_the_text():
    full = run_cli("run", TOK_MODEL, "-p", PROMPT, "-n", 16, "--greedy").stdout[:-1]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    r = run_cli("run", TOK_MODEL, "-p", PROMPT, "-n", 16, "--greedy", "--stop", stop)
    assert r.returncode == 0, r.stderr
    text = r.stdout[:-1]
    assert stop in text and full.startswith(text) and len(text) < len(full)


def test_run_sampling_with_seed_repeats():
    a = run_cli("run", TOK_MODEL, "-p", PROMPT, "-n", 8, "--temp", 0.9, "--top-p", 0.9, "--top-k", 40, "--seed", 5)
    b = run_cli("run", TOK_MODEL, "-p", PROMPT, "-n", 8, "--temp", 0.9, "--top-p", 0.9, "--top-k", 40, "--seed", 5)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout


def test_run_usage_errors():
    assert run_cli("run", TOK_MODEL).returncode == 2
    r = run_cli("run", TOK_MODEL, "-p", "x", "--greedy", "--temp", 0.5)
    assert r.returncode == 2 and "--greedy cannot be combined" in r.stderr
    r = run_cli("run", FIX / "nonexistent", "-p", "x")
    assert r.returncode == 2 and "nonexistent" in r.stderr


def test_bench_prints_a_json_line():
    r = run_cli("bench", FIX / "tiny-qwen3", "--prompt-len", 16, "--gen", 4, "--batch", 2, "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb"):
        assert res[key] > 0, key
    assert res["dtype"] == "bf16" and res["batch"] == 2 and res["gen"] == 4
