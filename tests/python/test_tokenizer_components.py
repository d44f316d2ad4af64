"""Each pipeline component against the `tokenizers` library: tokenizers are
built and trained here with the library itself, saved to JSON, loaded by
hubrt, and must give the same ids and decoded strings."""
import random

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer as HF, decoders, models, normalizers as nz, pre_tokenizers as pt, \
    processors, trainers  # noqa: E402

from hubrt import HubrtError  # noqa: E402
from hubrt.tokenizer import Tokenizer  # noqa: E402
from tok_corpus import CORPUS, big_document  # noqa: E402

TRAIN = CORPUS + [big_document(60_000, seed=1)]


def random_texts(n=40, seed=3):
    rng = random.Random(seed)
    alphabet = list("  \t\n abcXYZ0123456789.,!?'-_<>|é中ع😀\u0301\u00a0") + ["[CLS]", "<s>", "'re", "##"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(n)]


TEXTS = CORPUS + random_texts() + ["controls \x01\x08\x0b\x0e\x1f\x7f\x8f\x9f end", "\u1680\u200b\u200f\u2581\ufffd x"]


def compare(ref, texts=TEXTS, decode=True, offsets=True):
    ours = Tokenizer.from_str(ref.to_str())
    for text in texts:
        for special in (False, True):
            enc = ref.encode(text, add_special_tokens=special)
            want = enc.ids
            assert ours.encode(text, special) == want, f"ids differ for {text!r} (add_special={special})"
            if offsets:
                got = ours.encode_with_offsets(text, special)[1]
                assert got == enc.offsets, f"offsets differ for {text!r}: " + str(
                    [(t, a, b) for t, a, b in zip(enc.tokens, got, enc.offsets) if a != b][:3])
            if decode:
                for skip in (False, True):
                    assert ours.decode(want, skip) == ref.decode(want, skip_special_tokens=skip), \
                        f"decode differs for {text!r} ids {want}"
    return ours


def bpe(normalizer=None, pre_tokenizer=None, vocab_size=600, **model_kw):
    model_kw.setdefault("unk_token", "[UNK]")
    tok = HF(models.BPE(**model_kw))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer if pre_tokenizer is not None else pt.Whitespace()
    affixes = {k: model_kw[k] for k in ("continuing_subword_prefix", "end_of_word_suffix") if k in model_kw}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "[CLS]", "[SEP]", "<s>", "</s>"],
                                  show_progress=False, **affixes)
    tok.train_from_iterator(TRAIN, trainer)
    return tok


# ---- normalizers -----------------------------------------------------------------

NORMALIZERS = {
    "NFC": nz.NFC(), "NFD": nz.NFD(), "NFKC": nz.NFKC(), "NFKD": nz.NFKD(),
    "Lowercase": nz.Lowercase(), "Strip": nz.Strip(), "StripLeft": nz.Strip(left=True, right=False),
    "StripAccents": nz.Sequence([nz.NFD(), nz.StripAccents()]),
    "ReplaceString": nz.Replace(" ", "_"), "ReplaceRegex": nz.Replace(Regex(r"\s+"), " "),
    "Prepend": nz.Prepend("▁"),
    "Bert": nz.BertNormalizer(), "BertCased": nz.BertNormalizer(lowercase=False, strip_accents=False),
    "BertNoChinese": nz.BertNormalizer(handle_chinese_chars=False, clean_text=False),
    "Sequence": nz.Sequence([nz.NFKC(), nz.Lowercase(), nz.Replace("a", "b")]),
    "Nmt": nz.Nmt(),
}


@pytest.mark.parametrize("name", list(NORMALIZERS))
def test_normalizer(name):
    compare(bpe(normalizer=NORMALIZERS[name]))


# ---- pre-tokenizers ------------------------------------------------------------------

BEHAVIORS = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]

PRE_TOKENIZERS = {
    **{f"SplitString-{b}": pt.Split(" ", b) for b in BEHAVIORS},
    **{f"SplitRegex-{b}": pt.Split(Regex(r"\d+|[.,!?]"), b) for b in BEHAVIORS},
    **{f"SplitInvert-{b}": pt.Split(Regex(r"\w+"), b, invert=True) for b in BEHAVIORS},
    "SplitUnicodeClasses": pt.Split(Regex(r"\s+|\p{L}+|\p{N}"), "isolated"),
    "ByteLevel": pt.ByteLevel(), "ByteLevelNoPrefix": pt.ByteLevel(add_prefix_space=False),
    "ByteLevelNoRegex": pt.ByteLevel(add_prefix_space=False, use_regex=False),
    "MetaspaceAlways": pt.Metaspace(prepend_scheme="always"), "MetaspaceFirst": pt.Metaspace(prepend_scheme="first"),
    "MetaspaceNever": pt.Metaspace(prepend_scheme="never"), "MetaspaceNoSplit": pt.Metaspace(split=False),
    "Digits": pt.Digits(), "DigitsIndividual": pt.Digits(individual_digits=True),
    **{f"Punctuation-{b}": pt.Punctuation(b) for b in BEHAVIORS},
    "Whitespace": pt.Whitespace(), "WhitespaceSplit": pt.WhitespaceSplit(), "Bert": pt.BertPreTokenizer(),
    "CharDelimiterSplit": pt.CharDelimiterSplit("a"),
    "Sequence": pt.Sequence([pt.WhitespaceSplit(), pt.Digits(individual_digits=True), pt.Punctuation()]),
}


@pytest.mark.parametrize("name", list(PRE_TOKENIZERS))
def test_pre_tokenizer(name):
    p = PRE_TOKENIZERS[name]
    tok = bpe(pre_tokenizer=p)
    if name.startswith("ByteLevel"):
        tok.decoder = decoders.ByteLevel()
    elif name.startswith("Metaspace"):
        tok.decoder = decoders.Metaspace(prepend_scheme=p.prepend_scheme)
    compare(tok)


# ---- models --------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {}, {"fuse_unk": True}, {"continuing_subword_prefix": "##"}, {"end_of_word_suffix": "</w>"},
    {"ignore_merges": True}, {"unk_token": None},
], ids=["plain", "fuse_unk", "prefix", "suffix", "ignore_merges", "no_unk"])
def test_bpe_options(kw):
    compare(bpe(**kw))


def test_bpe_byte_fallback():
    tok = bpe(pre_tokenizer=pt.Metaspace(), byte_fallback=True, vocab_size=400)
    vocab = tok.get_vocab()
    # byte tokens must exist for fallback; add them like sentencepiece-converted models have them
    tok.add_tokens([])
    model = tok.model
    v = dict(model.get_vocab() if hasattr(model, "get_vocab") else vocab)
    for b in range(256):
        v.setdefault(f"<0x{b:02X}>", len(v))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in __import__("json").loads(tok.to_str())["model"]["merges"]]
    tok.model = models.BPE(v, merges, unk_token="[UNK]", byte_fallback=True, fuse_unk=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    compare(tok)


def test_wordpiece_bert():
    tok = HF(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = nz.BertNormalizer()
    tok.pre_tokenizer = pt.BertPreTokenizer()
    tok.train_from_iterator(TRAIN, trainers.WordPieceTrainer(vocab_size=700, special_tokens=["[UNK]", "[CLS]", "[SEP]"],
                                                             show_progress=False))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    tok.decoder = decoders.WordPiece()
    compare(tok)


@pytest.mark.parametrize("byte_fallback", [False, True])
def test_unigram(byte_fallback):
    tok = HF(models.Unigram())
    tok.normalizer = nz.NFKC()
    tok.pre_tokenizer = pt.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TRAIN, trainers.UnigramTrainer(vocab_size=500, special_tokens=["<unk>"], unk_token="<unk>",
                                                           byte_fallback=byte_fallback, show_progress=False))
    if byte_fallback:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    compare(tok)


def test_wordlevel():
    tok = HF(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pt.Whitespace()
    tok.train_from_iterator(TRAIN, trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False))
    compare(tok)


# ---- added tokens, post-processors --------------------------------------------------------

def test_added_tokens_flags():
    tok = bpe(normalizer=nz.Lowercase(), pre_tokenizer=pt.ByteLevel())
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken("<|SPECIAL|>", lstrip=True, rstrip=True),
                            tokenizers.AddedToken("[MASK]", single_word=True)])
    tok.add_tokens([tokenizers.AddedToken("hello", normalized=True), tokenizers.AddedToken("World", normalized=False),
                    tokenizers.AddedToken(" spaced", normalized=False), tokenizers.AddedToken("ab", single_word=True)])
    texts = TEXTS + ["Hello World hello  <|SPECIAL|>  x", "a [MASK] b x[MASK]y [MASK]", "ab xab abx ab",
                     "HELLO world World", "<|SPECIAL|><|SPECIAL|>", "  spaced out"]
    compare(tok, texts)


def test_post_processors():
    tok = bpe()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    for proc in [processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                               special_tokens=[("[CLS]", cls), ("[SEP]", sep)]),
                 processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls)),
                 processors.RobertaProcessing(("</s>", e), ("<s>", s)),
                 processors.Sequence([processors.ByteLevel(), processors.TemplateProcessing(
                     single="<s> $A", special_tokens=[("<s>", s)])])]:
        tok.post_processor = proc
        compare(tok, CORPUS[:12])


def test_pairs():
    tok = bpe()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    pairs = [("Hello world", "How are you?"), ("", "x"), ("数字123", ""), ("a [SEP] b", "c")]
    for proc in [None, processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                     special_tokens=[("[CLS]", cls), ("[SEP]", sep)]),
                 processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls)),
                 processors.RobertaProcessing(("</s>", e), ("<s>", s)),
                 processors.Sequence([processors.ByteLevel(), processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))])]:
        if proc is not None:
            tok.post_processor = proc
        ours = Tokenizer.from_str(tok.to_str())
        for a, b in pairs:
            for special in (True, False):
                ref = tok.encode(a, b, add_special_tokens=special)
                assert ours.encode_pair(a, b, special) == (ref.ids, ref.type_ids), (type(proc).__name__, a, b, special)


@pytest.mark.parametrize("trim", [True, False])
@pytest.mark.parametrize("prefix", [True, False])
def test_byte_level_trim_offsets(trim, prefix):
    """GPT-2 and RoBERTa style: ByteLevel everywhere, offsets trimmed of spaces."""
    tok = bpe(pre_tokenizer=pt.ByteLevel(add_prefix_space=prefix))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=trim, add_prefix_space=prefix)
    compare(tok)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
                                                      trim_offsets=trim, add_prefix_space=prefix)
    compare(tok)


# ---- decoders ------------------------------------------------------------------------------

DECODERS = {
    "ByteLevel": decoders.ByteLevel(), "Metaspace": decoders.Metaspace(),
    "MetaspaceNever": decoders.Metaspace(prepend_scheme="never"), "Replace": decoders.Replace("_", " "),
    "ReplaceRegex": decoders.Replace(Regex("a+"), "A"), "ByteFallback": decoders.ByteFallback(), "Fuse": decoders.Fuse(),
    "StripEnd": decoders.Strip("a", 0, 1), "StripStart": decoders.Strip(" ", 1, 0), "WordPiece": decoders.WordPiece(), "WordPieceNoClean": decoders.WordPiece(cleanup=False),
    "BPEDecoder": decoders.BPEDecoder(), "CTC": decoders.CTC(pad_token="a"),
    "Sequence": decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]),
}


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder(name):
    vocab = {t: i for i, t in enumerate(["a", "aa", "b", " ", "_", "▁", "▁a", "##b", "</w>", "a</w>", "<0x41>", "<0xE2>",
                                          "<0x82>", "<0xAC>", "<0xFF>", "Ġ", "Ġa", "ċ", "'", "s", ".", ",", "n't", "é", "Ã", "©"])}
    tok = HF(models.WordLevel(vocab, unk_token="a"))
    tok.decoder = DECODERS[name]
    ours = Tokenizer.from_str(tok.to_str())
    rng = random.Random(7)
    seqs = [[rng.randrange(len(vocab)) for _ in range(rng.randint(0, 8))] for _ in range(300)]
    seqs += [[11, 12, 13], [11, 12], [10, 14, 10], [6, 7, 8, 9], [18, 19, 20, 3, 22]]
    for ids in seqs:
        assert ours.decode(ids) == tok.decode(ids), f"{name}: {[tok.id_to_token(i) for i in ids]}"


# ---- bad input -------------------------------------------------------------------------------

def load_error(text):
    with pytest.raises(HubrtError) as e:
        Tokenizer.from_str(text)
    return str(e.value)


def test_bad_json():
    assert "malformed JSON" in load_error('{"model": {"type": "BPE", ')
    assert "line 2" in load_error('{\n "model": [}')


def test_unknown_components():
    base = bpe().to_str()
    import json
    for field, msg in [("pre_tokenizer", "unsupported pre-tokenizer 'Foo'"), ("normalizer", "unsupported normalizer 'Foo'"),
                       ("decoder", "unsupported decoder 'Foo'"), ("post_processor", "unsupported post-processor 'Foo'"),
                       ("model", "unsupported model 'Foo'")]:
        d = json.loads(base)
        d[field] = {"type": "Foo"}
        assert msg in load_error(json.dumps(d))


def test_bad_merges_and_regex():
    import json
    d = json.loads(bpe().to_str())
    d["model"]["merges"].append(["zzzq", "qqq"])
    assert "not in the vocab" in load_error(json.dumps(d))
    d = json.loads(bpe().to_str())
    d["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": False}
    assert "does not compile" in load_error(json.dumps(d))


# ---- SentencePiece-converted tokenizers (Precompiled normalizer) -----------------------

def _proto_fields(buf):
    """(field, wire type, value) of a protobuf message, enough for ModelProto."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 1:
            val, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wt == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((field, wt, val))
    return out


def _varint(buf, i):
    shift = val = 0
    while True:
        b = buf[i]
        i += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return val, i


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A SentencePiece unigram model trained here with nmt_nfkc: its pieces and
    its precompiled_charsmap."""
    spm = pytest.importorskip("sentencepiece")
    import struct
    d = tmp_path_factory.mktemp("spm")
    (d / "train.txt").write_text("\n".join(TRAIN))
    spm.SentencePieceTrainer.train(input=str(d / "train.txt"), model_prefix=str(d / "m"), vocab_size=400,
                                   model_type="unigram", normalization_rule_name="nmt_nfkc", minloglevel=2)
    fields = _proto_fields((d / "m.model").read_bytes())
    pieces = []
    for f, _, v in fields:
        if f == 1:
            p = {pf: pv for pf, _, pv in _proto_fields(v)}
            pieces.append((p[1].decode(), struct.unpack("<f", p[2])[0], p.get(3, 1)))
    charsmap = next(pv for f, _, v in fields if f == 3 for pf, _, pv in _proto_fields(v) if pf == 2)
    return pieces, charsmap


def test_precompiled_t5_style(spm_model):
    pieces, charsmap = spm_model
    unk = next(i for i, p in enumerate(pieces) if p[2] == 2)
    tok = HF(models.Unigram([(p, s) for p, s, _ in pieces], unk_id=unk, byte_fallback=False))
    tok.normalizer = nz.Sequence([nz.Precompiled(charsmap), nz.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pt.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    odd = ["ｆｕｌｌｗｉｄｔｈ ﾊﾝｶｸ ｶﾞ \uff76\uff9e ①②", "ﬁ ﬀ ™ ½ ㎏ ℃ Ⅻ", "e\u0301 a\u0300\u0301 👨‍👩‍👧 🇫🇷🇩🇪",
           "\u200b\u00ad\ufeff soft", "한국어 ᄀ ᅡ \u1100\u1161\u11a8", "tab\tnew\nline\r\n"]
    compare(tok, TEXTS + odd)


def test_precompiled_bad_charsmap():
    tok = HF(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    import json
    d = json.loads(tok.to_str())
    d["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": "AAAA!"}
    with pytest.raises(HubrtError, match="not base64"):
        Tokenizer.from_str(json.dumps(d))
    d["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": "/////w=="}
    with pytest.raises(HubrtError, match="bad trie size"):
        Tokenizer.from_str(json.dumps(d))
    d["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": None}
    assert Tokenizer.from_str(json.dumps(d)).encode("a", False) == [0]
