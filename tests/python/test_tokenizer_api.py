"""The transformers-shaped Python front end and the CLI: hubrt.AutoTokenizer
against transformers.AutoTokenizer on the shared tokenizers, and `hubrt
tokenize` / `hubrt detokenize` against the library."""
import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from hubrt import HubrtError
from hubrt.tokenizer import AutoTokenizer, Tokenizer
from tok_corpus import CORPUS

SHARED = Path(os.environ.get("HUBRT_SHARED_DIR", Path(__file__).resolve().parents[3] / "shared"))
TOKDIR = SHARED / "data" / "tokenizers"
ROOT = Path(__file__).resolve().parents[2]


def shared(name):
    path = TOKDIR / name
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma3"])
def test_matches_transformers(name):
    transformers = pytest.importorskip("transformers")
    path = shared(name)
    ours, ref = AutoTokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(str(path))
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert len(ours) == len(ref)
    assert ours.chat_template == ref.chat_template
    for text in CORPUS:
        ids = ref(text)["input_ids"]
        assert ours(text)["input_ids"] == ids
        assert ours.decode(ids) == ref.decode(ids)
        # GemmaTokenizer in transformers also drops <mask> and <unusedN>, which
        # tokenizer.json does not mark special; hubrt follows tokenizer.json.
        if name != "gemma3":
            assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    batch = ["Hello world", "a b c d e f"]
    assert ours(batch)["input_ids"] == ref(batch)["input_ids"]
    text = "Hello wörld 你好"
    assert ours(text, return_offsets_mapping=True)["offset_mapping"] == \
        [tuple(x) for x in ref(text, return_offsets_mapping=True)["offset_mapping"]]


PAD_CASES = [
    dict(padding=True),
    dict(padding=True, padding_side="left"),
    dict(padding=True, padding_side="right", pad_to_multiple_of=8),
    dict(truncation=True, max_length=5),
    dict(max_length=4),  # truncates (transformers warns)
    dict(padding="max_length", truncation=True, max_length=12),
    dict(padding="max_length", max_length=40),
    dict(padding=True, truncation="longest_first", max_length=6, return_offsets_mapping=True),
    dict(padding="max_length"),  # to model_max_length, or not at all where that is no limit
    dict(truncation=True, max_length=1),  # gemma3: its <bos> alone
    dict(padding="max_length", truncation=True, max_length=0),  # below gemma3's <bos>: left whole
    dict(padding=True, truncation=True, max_length=6, pad_to_multiple_of=4),  # raises: 6 is no multiple of 4
]


@functools.lru_cache(maxsize=None)
def both(name):
    """(ours, transformers') for a shared tokenizer, and the defaults both
    read from its tokenizer_config.json."""
    transformers = pytest.importorskip("transformers")
    path = shared(name)
    ours, ref = AutoTokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(str(path))
    assert (ours.padding_side, ours.truncation_side, ours.model_max_length) == \
        (ref.padding_side, ref.truncation_side, ref.model_max_length)
    return ours, ref, ours.truncation_side


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma3"])
@pytest.mark.parametrize("case", range(len(PAD_CASES)))
@pytest.mark.parametrize("side", [None, "left"])
def test_padding_and_truncation_match_transformers(name, case, side):
    """padding, truncation, max_length, pad_to_multiple_of, padding_side and
    truncation_side (from tokenizer_config.json or set) as transformers
    applies them; padding without a pad token fails in both."""
    ours, ref, default_side = both(name)
    ours.truncation_side = ref.truncation_side = side or default_side
    kwargs = PAD_CASES[case]
    batch = ["Hello world", "a b c d e f", "Hello wörld 你好, and a longer line of text than the rest"]
    for texts in (batch, batch[2]):
        try:
            want = ref(texts, **kwargs)
        except ValueError as e:
            assert "pad" in str(e) or "max_length" in str(e), e
            with pytest.raises(ValueError, match="pad|max_length"):
                ours(texts, **kwargs)
            continue
        got = ours(texts, **kwargs)
        assert got["input_ids"] == want["input_ids"], texts
        assert got["attention_mask"] == want["attention_mask"]
        if "offset_mapping" in want:
            rows = want["offset_mapping"] if isinstance(texts, list) else [want["offset_mapping"]]
            ours_rows = got["offset_mapping"] if isinstance(texts, list) else [got["offset_mapping"]]
            assert ours_rows == [[tuple(x) for x in r] for r in rows]


def test_call_shapes():
    tok = AutoTokenizer.from_pretrained(shared("qwen3"))
    enc = tok(["a", "a b c"], padding=True, return_tensors="np")
    assert enc["input_ids"].shape == enc["attention_mask"].shape == (2, 3)
    assert enc["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert enc["input_ids"][0, 1] == tok.pad_token_id
    assert tok.batch_decode(enc["input_ids"][1:]) == ["a b c"]
    assert tok.convert_ids_to_tokens(tok.encode("Hi there")) == ["Hi", "Ġthere"]
    assert tok.backend.model_type == "BPE"


def cli():
    lib = os.environ.get("HUBRT_LIBRARY", str(ROOT / "build" / "libhubrt.so"))
    exe = Path(lib).parent / "hubrt"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    return str(exe)


def test_cli_round_trip():
    exe, path = cli(), shared("gemma3")
    texts = ["Hello world", "", "tabs\tand\nnewlines", "😀 <start_of_turn>"]
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run([exe, "tokenize", str(path), "--add-special-tokens"], input=lines, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    ref = Tokenizer.from_file(str(path))
    assert [json.loads(x) for x in out] == [ref.encode(t, True) for t in texts]
    back = subprocess.run([exe, "detokenize", str(path), "--skip-special-tokens"], input="\n".join(out) + "\n",
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert [json.loads(x) for x in back] == [t.replace("<start_of_turn>", "") for t in texts]


def test_cli_bad_input():
    exe, path = cli(), shared("qwen3")
    r = subprocess.run([exe, "tokenize", str(path)], input="not json\n", capture_output=True, text=True)
    assert r.returncode == 2 and "line 1: expected a JSON string" in r.stderr
    r = subprocess.run([exe, "detokenize", str(path)], input="[1, 999999999]\n", capture_output=True, text=True)
    assert r.returncode == 2 and "outside the vocabulary" in r.stderr
    r = subprocess.run([exe, "tokenize", "/nonexistent"], input="", capture_output=True, text=True)
    assert r.returncode == 2


def test_bad_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}')
    with pytest.raises(HubrtError, match="merge 0 names token 'b'"):
        AutoTokenizer.from_pretrained(tmp_path)
