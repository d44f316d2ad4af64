"""tokenizer.json files written to be hostile: added tokens that claim huge,
colliding, duplicate or out-of-order ids. Hugging Face tokenizers ignores
the claimed ids and numbers added tokens itself; hubrt must give the same
ids, decode every valid id the same way, and allocate nothing sized by a
claimed number (the CLI's peak RSS is checked)."""
import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
from hubrt import HubrtError  # noqa: E402
from hubrt.tokenizer import Tokenizer  # noqa: E402
from hubrt_cli_util import run_with_peak  # noqa: E402



def added(content, id_, special=True, **flags):
    tok = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": not special, "special": special}
    tok.update(flags)
    return tok


def tokenizer_json(added_tokens, vocab=None, model="WordLevel"):
    vocab = vocab or {"[UNK]": 0, "a": 1, "b": 2}
    if model == "WordLevel":
        m = {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    else:
        m = {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": []}
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
                       "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
                       "decoder": None, "model": m})


HOSTILE = {
    "huge_id": [added("<x>", 2147483646)],
    "id_99999999_not_special": [added("<x>", 99999999, special=False)],
    "u32_max": [added("<x>", 4294967295)],
    "collides_with_vocab": [added("<x>", 1)],
    "below_vocab_size": [added("<x>", 0)],
    "content_in_vocab": [added("b", 7)],
    "same_id_twice": [added("<x>", 5), added("<y>", 5)],
    "out_of_order": [added("<x>", 5), added("<y>", 3)],
    "gap": [added("<x>", 3), added("<y>", 10)],
    "in_vocab_then_new": [added("b", 9), added("<x>", 3)],
    "duplicate_content_flags": [added("<x>", 3), added("<x>", 4, special=False)],
    "duplicate_content_flags_rev": [added("<x>", 3, special=False), added("<x>", 4)],
    "duplicate_identical": [added("<x>", 3), added("<x>", 3), added("<y>", 4)],
    "empty_content": [added("", 3), added("<x>", 4)],
    "many": [added(f"<t{i}>", 2000000000 - 7 * i, special=i % 2 == 0) for i in range(50)],
}
VOCABS = {
    "holey": {"[UNK]": 0, "a": 1, "b": 3},
    "holey_far": {"[UNK]": 0, "a": 1, "b": 5},
    "far_id": {"[UNK]": 0, "a": 1, "b": 2147483000},
    "far_ids_many": {"[UNK]": 0, "a": 1900000000, "b": 2147483646, "c": 7},
}
TEXTS = ["a<x>a", "a<x>b<y>a", "aba", "b<x>", "<x><x><y>", "a <t0> b <t7><t49>", "[UNK]b<x>", "", "ccc<x>"]


def check_same(raw, extra_ids=()):
    ref = tokenizers.Tokenizer.from_str(raw)
    ours = Tokenizer.from_str(raw)
    for text in TEXTS:
        want = ref.encode(text).ids
        assert ours.encode(text, False) == want, f"ids differ for {text!r}"
    n = max(ref.get_vocab_size(True), 1) + 60
    for i in list(range(n)) + list(extra_ids):
        tok = ref.id_to_token(i)
        if tok is None:
            continue
        assert ours.id_to_token(i) == tok, f"id {i}"
        for skip in (False, True):
            assert ours.decode([i], skip) == ref.decode([i], skip_special_tokens=skip), f"decode of id {i}"
    for c in ("<x>", "<y>", "b", "<t49>"):
        assert (ours.token_to_id(c) if ref.token_to_id(c) is not None else None) == ref.token_to_id(c)


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("model", ["WordLevel", "BPE"])
def test_added_token_ids_as_tokenizers_assigns_them(case, model):
    check_same(tokenizer_json(HOSTILE[case], model=model))


@pytest.mark.parametrize("model", ["WordLevel", "BPE"])
@pytest.mark.parametrize("vocab", sorted(VOCABS))
def test_added_tokens_beside_a_vocab_with_holes(vocab, model):
    for toks in ([], [added("<x>", 7)], [added("b", 5), added("<x>", 6)], [added("<x>", 3), added("<y>", 3)]):
        raw = tokenizer_json(toks, vocab=VOCABS[vocab], model=model)
        check_same(raw, extra_ids=list(VOCABS[vocab].values()))


@pytest.mark.parametrize("bad", [-1, 4294967296, 1.5, "3"])
def test_added_token_id_outside_u32_is_refused(bad):
    raw = tokenizer_json([added("<x>", bad)])
    with pytest.raises(Exception):
        tokenizers.Tokenizer.from_str(raw)
    with pytest.raises(HubrtError, match=r"added_tokens\[0\].*'id'"):
        Tokenizer.from_str(raw)


def test_cli_far_vocab_ids_cost_nothing(tmp_path):
    """A vocab entry at id 2147483000 (tokenizers accepts any u32): the
    tables are sized by the entries, not by the id."""
    (tmp_path / "tokenizer.json").write_text(tokenizer_json([added("<x>", 9)], vocab=VOCABS["far_id"]))
    rc, out, err, peak = run_with_peak(["tokenize", str(tmp_path)], '"a b <x>"\n')
    assert rc == 0, err
    assert json.loads(out) == tokenizers.Tokenizer.from_str(
        tokenizer_json([added("<x>", 9)], vocab=VOCABS["far_id"])).encode("a b <x>").ids == [1, 2147483000, 3]
    assert peak < 100 * 1024, f"peak RSS {peak} kB"


@pytest.mark.parametrize("claimed", [2147483646, 99999999])
def test_cli_huge_claimed_id_costs_nothing(tmp_path, claimed):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json([added("<x>", claimed)]))
    rc, out, err, peak = run_with_peak(["tokenize", str(tmp_path)], '"a<x>a"\n')
    assert rc == 0, err
    assert json.loads(out) == [1, 3, 1]
    assert peak < 100 * 1024, f"peak RSS {peak} kB"
    rc, out, err, _ = run_with_peak(["detokenize", str(tmp_path)], "[1]\n[3]\n")
    assert rc == 0, err
    assert [json.loads(line) for line in out.splitlines()] == ["a", "<x>"]
    rc, out, err, _ = run_with_peak(["detokenize", str(tmp_path)], f"[{claimed}]\n")
    assert rc == 2 and "outside the vocabulary (size 4)" in err, err


def test_oversized_tokenizer_file_is_refused_unread(tmp_path):
    """A 600 MB tokenizer.json (sparse: no disk used) is refused by its size, not parsed."""
    with open(tmp_path / "tokenizer.json", "wb") as f:
        f.truncate(600 << 20)
    rc, out, err, peak = run_with_peak(["tokenize", str(tmp_path)], '"a"\n')
    assert rc == 2 and "more than the 536870912 a tokenizer file may hold" in err, err
    assert peak < 64 * 1024
