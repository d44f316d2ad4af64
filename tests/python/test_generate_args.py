"""transformers' generate() arguments against transformers itself:
min_new_tokens, no_repeat_ngram_size, bad_words_ids (greedy, token
identical over a left-padded batch), return_dict_in_generate with
output_logits and output_scores (the scores after every processor and
warper, checked against transformers' own processors applied to hubrt's
raw logits), the streamer protocol (put of the prompt, then of each step's
tokens, then end; TextIteratorStreamer's text), num_return_sequences, a
GenerationConfig, and unknown arguments refused by name."""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM as HFModel
from transformers import AutoTokenizer, GenerationConfig, TextIteratorStreamer
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

import hubrt

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
NAME = "tiny-llama"


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "tiny"], check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def models():
    hf = HFModel.from_pretrained(FIX / NAME, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    return hubrt.AutoModelForCausalLM.from_pretrained(FIX / NAME), hf


def batch(seed=1):
    ids = np.random.default_rng(seed).integers(3, 512, (3, 10))
    mask = np.ones_like(ids)
    for row, npad in enumerate([0, 2, 6]):
        ids[row, :npad] = 0
        mask[row, :npad] = 0
    return ids, mask


def both(models, eos=None, **kw):
    ours, hf = models
    ids, mask = batch()
    got = ours.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=eos if eos is not None else [],
                        **kw)
    want = hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=24, do_sample=False,
                       eos_token_id=eos, pad_token_id=0, **kw).numpy()
    return got, want


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_size(models, n):
    got, want = both(models, no_repeat_ngram_size=n)
    np.testing.assert_array_equal(got, want)
    # these prompts' plain greedy rows repeat a bigram and a trigram: the processor must change them
    ours, hf = models
    ids = np.random.default_rng(1).integers(3, 500, (3, 10))
    plain = ours.generate(ids, max_new_tokens=24, eos_token_id=[])
    got = ours.generate(ids, max_new_tokens=24, eos_token_id=[], no_repeat_ngram_size=n)
    want = hf.generate(torch.tensor(ids), max_new_tokens=24, do_sample=False, no_repeat_ngram_size=n).numpy()
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(plain, got), "the processor changed nothing: the test sees nothing"


def test_bad_words_ids(models):
    plain, _ = both(models)
    new = plain[:, 10:]
    single = int(new[0, 0])
    pair = [int(new[1, 3]), int(new[1, 4])]
    got, want = both(models, bad_words_ids=[[single], pair])
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(plain, got)


def test_min_new_tokens_holds_back_eos(models):
    plain, _ = both(models)
    eos = int(plain[0, 12])  # row 0's third new token: it would end there
    early, want_early = both(models, eos=eos)
    np.testing.assert_array_equal(early, want_early)
    got, want = both(models, eos=eos, min_new_tokens=8)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(early, got)


def test_output_logits_and_scores_greedy(models):
    ours, hf = models
    ids, mask = batch()
    kw = dict(attention_mask=mask, max_new_tokens=6, return_dict_in_generate=True, output_scores=True,
              output_logits=True, repetition_penalty=1.3, no_repeat_ngram_size=2)
    got = ours.generate(ids, eos_token_id=[], **kw)
    want = hf.generate(torch.tensor(ids), do_sample=False, eos_token_id=None, pad_token_id=0,
                       **dict(kw, attention_mask=torch.tensor(mask)))
    np.testing.assert_array_equal(got.sequences, want.sequences.numpy())
    assert len(got.scores) == len(want.scores) == len(got.logits) == 6
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)
    for a, b in zip(got.scores, want.scores):
        b = b.numpy()
        assert np.array_equal(np.isinf(a), np.isinf(b))
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-4, atol=1e-4)


def test_sampling_scores_are_transformers_warpers_on_the_raw_logits(models):
    ours, _ = models
    ids, mask = batch()
    out = ours.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=5, do_sample=True,
                        temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2, seed=3, eos_token_id=[],
                        return_dict_in_generate=True, output_scores=True, output_logits=True)
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7),
                                 TopKLogitsWarper(20), TopPLogitsWarper(0.9)])
    seq = out.sequences
    for step, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        prefix = seq[:, :10 + step]
        # the penalty reads real tokens only: padding (id 0) of the left-padded rows is not history
        want = torch.stack([procs(prefix[r:r + 1][:, torch.tensor(mask[r]).bool().tolist() + [True] * step],
                                  raw[r:r + 1].clone())[0] for r in range(len(seq))])
        assert torch.equal(torch.isinf(scores), torch.isinf(want))
        torch.testing.assert_close(scores[torch.isfinite(scores)], want[torch.isfinite(want)], rtol=1e-4,
                                   atol=1e-4)
        assert all(scores[r, seq[r, 10 + step]] > -float("inf") for r in range(len(seq)))


class Recorder:
    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(("put", np.asarray(value).copy()))

    def end(self):
        self.calls.append(("end", None))


def test_streamer_protocol(models):
    ours, _ = models
    ids, mask = batch()
    rec = Recorder()
    out = ours.generate(ids, attention_mask=mask, max_new_tokens=7, eos_token_id=[], streamer=rec)
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["put"] * 8 + ["end"]
    np.testing.assert_array_equal(rec.calls[0][1], ids)
    np.testing.assert_array_equal(np.stack([c[1] for c in rec.calls[1:8]], axis=1), out[:, 10:])


def test_text_iterator_streamer_gives_the_text():
    name = "tiny-qwen3-tok"
    tok = AutoTokenizer.from_pretrained(FIX / name)
    model = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name)
    ids = np.array([tok.encode("The quick brown fox")])
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    result = {}
    t = threading.Thread(target=lambda: result.update(out=model.generate(
        torch.tensor(ids), max_new_tokens=12, do_sample=False, eos_token_id=[], streamer=streamer)))
    t.start()
    text = "".join(streamer)
    t.join()
    assert text == tok.decode(result["out"][0, ids.shape[1]:])


@pytest.mark.parametrize("pick", [(3, 0, None), (5, 1, 3), (7, 0, 2)])
def test_stop_strings_end_rows_as_transformers_does(pick):
    """The stop string: a piece of the text greedy decoding gives (a whole
    token's text, or a part that ends inside a token)."""
    name = "tiny-qwen3-tok"
    tok = AutoTokenizer.from_pretrained(FIX / name)
    ours = hubrt.AutoModelForCausalLM.from_pretrained(FIX / name)
    hf = HFModel.from_pretrained(FIX / name, dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("The quick brown fox"), tok.encode("Once upon a time there")][:1])
    plain = ours.generate(ids, max_new_tokens=16, eos_token_id=[])
    step, start, stop = pick
    text = tok.decode(plain[0, ids.shape[1] + step:ids.shape[1] + step + 1])
    stop_string = text[start:stop] or text
    assert stop_string.strip(), "an empty stop string: pick another token"
    got = ours.generate(ids, max_new_tokens=16, eos_token_id=[], stop_strings=[stop_string], tokenizer=tok)
    want = hf.generate(ids, max_new_tokens=16, do_sample=False, stop_strings=[stop_string], tokenizer=tok,
                       eos_token_id=None, pad_token_id=0)
    np.testing.assert_array_equal(got, want.numpy())
    assert got.shape[1] < plain.shape[1]


def test_stop_strings_need_the_tokenizer(models):
    with pytest.raises(ValueError, match="tokenizer"):
        models[0].generate(np.array([[5, 6, 7]]), max_new_tokens=2, stop_strings=["x"])


def test_num_return_sequences_and_generation_config(models):
    ours, _ = models
    ids, mask = batch()
    gc = GenerationConfig(do_sample=True, top_k=0, max_new_tokens=6, num_return_sequences=2)
    out = ours.generate(ids, attention_mask=mask, generation_config=gc, seed=5, eos_token_id=[])
    assert out.shape == (6, 16)
    np.testing.assert_array_equal(out[:, :10], np.repeat(ids, 2, axis=0))
    assert not np.array_equal(out[0], out[1]), "two draws of one prompt came out the same"
    again = ours.generate(ids, attention_mask=mask, generation_config=gc, seed=5, eos_token_id=[])
    np.testing.assert_array_equal(out, again)


@pytest.mark.parametrize("arg", ["num_beams", "penalty_alpha", "guidance_scale"])
def test_unknown_arguments_are_refused_by_name(models, arg):
    ours, _ = models
    with pytest.raises(ValueError, match=f"does not support {arg}"):
        ours.generate(np.array([[5, 6, 7]]), max_new_tokens=2, **{arg: 2})
