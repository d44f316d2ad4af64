"""A tiny CLIP tokenizer folder as the Hub stores SD3's: vocab.json and
merges.txt (trained here with `tokenizers` in CLIP's own pipeline:
normalizer, split pattern, byte level, the "</w>" suffix) and
tokenizer_config.json, without tokenizer.json."""
import os

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

CORPUS = [
    "A photo of a cat sitting on a red chair, 4k, highly detailed!",
    "An astronaut riding a horse on the moon; cinematic lighting.",
    "Portrait of an old man with a beard -- oil painting, 1890s",
    "A bowl of fruit: apples, oranges and bananas. It's delicious!!",
    "the quick brown fox jumps over the lazy dog 0123456789",
    "Tokyo street at night, neon signs, rain; we'll see what's there",
] * 4


def make_clip_tokenizer(path, pad_token="<|endoftext|>", vocab_size=400):
    from transformers import CLIPTokenizer

    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token="<|endoftext|>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                             behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, end_of_word_suffix="</w>",
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|startoftext|>", "<|endoftext|>"])
    tok.train_from_iterator(CORPUS, trainer)
    os.makedirs(path, exist_ok=True)
    tok.model.save(str(path))  # vocab.json + merges.txt ("#version" header)
    ref = CLIPTokenizer(vocab_file=os.path.join(path, "vocab.json"), merges_file=os.path.join(path, "merges.txt"),
                        pad_token=pad_token, model_max_length=77)
    ref.save_pretrained(path)
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        os.remove(os.path.join(path, "tokenizer.json"))  # as SD3's folders: vocab.json + merges.txt only
    return CLIPTokenizer.from_pretrained(path)


def make_t5_tokenizer(path, vocab_size=150):
    """A tiny T5 Unigram tokenizer (<pad> 0, </s> 1, <unk> 2), trained here,
    saved by transformers' T5Tokenizer with its tokenizer.json."""
    import json

    from tokenizers import trainers as tr
    from transformers import T5Tokenizer

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    trainer = tr.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    vocab = [tuple(v) for v in json.loads(tok.to_str())["model"]["vocab"]]
    ref = T5Tokenizer(vocab=vocab, extra_ids=0)
    ref.save_pretrained(path)
    return T5Tokenizer.from_pretrained(path)
