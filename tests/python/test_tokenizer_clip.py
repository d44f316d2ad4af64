"""CLIPTokenizer folders without tokenizer.json (vocab.json + merges.txt, as
SD3's tokenizer/ and tokenizer_2/ hold them): hubrt builds the tokenizer
transformers builds from the same files; ids equal on varied text (case,
whitespace runs, punctuation runs, digits, contractions, special tokens in
the text, unicode), with CLIP-L's pad token and CLIP-G's "!"."""
import pytest

import hubrt
from clip_tokenizer_util import make_clip_tokenizer

TEXTS = ["A photo of a cat", "  Multiple   spaces\tand\nnewlines  ", "HELLO!!! What's up?? we'll go",
         "<|startoftext|>inline special<|endoftext|> tokens", "digits 12345 and 3.14", "Café naïve 東京 😀",
         "a bowl of fruit: apples, oranges and bananas", "", "!!", "x" * 200]


@pytest.mark.parametrize("pad", ["<|endoftext|>", "!"])
def test_clip_tokenizer_from_vocab_and_merges_equals_transformers(tmp_path, pad):
    ref = make_clip_tokenizer(tmp_path / "tok", pad_token=pad)
    ours = hubrt.AutoTokenizer.from_pretrained(tmp_path / "tok")
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"], text
    assert ours.pad_token_id == ref.pad_token_id
    assert ours.eos_token_id == ref.eos_token_id and ours.bos_token_id == ref.bos_token_id


def test_bad_clip_folders_fail_naming_the_file(tmp_path):
    make_clip_tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(hubrt.HubrtError, match="merges.txt: line 2 is not two tokens"):
        hubrt.AutoTokenizer.from_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "merges.txt").write_bytes(b"#version: 0.2\na \xffb\n")
    with pytest.raises(hubrt.HubrtError, match=r"merges.txt: not UTF-8 text \(at byte 16\)"):
        hubrt.AutoTokenizer.from_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "tok" / "vocab.json").write_text("[1, 2]")
    with pytest.raises(hubrt.HubrtError, match="vocab.json: not a JSON object"):
        hubrt.AutoTokenizer.from_pretrained(tmp_path / "tok")
