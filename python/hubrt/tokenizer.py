"""Tokenizers: hubrt's C implementation of tokenizer.json, shaped like
transformers' AutoTokenizer (from_pretrained, __call__, encode, decode,
batch_decode)."""
import ctypes
import json
import os

from ._lib import check, fn

_P = ctypes.c_void_p
_I32P = ctypes.POINTER(ctypes.c_int32)
_SZ = ctypes.c_size_t

_load = fn("hr_tokenizer_load", [ctypes.c_char_p, ctypes.POINTER(_P)])
_load_json = fn("hr_tokenizer_load_json", [ctypes.c_char_p, _SZ, ctypes.POINTER(_P)])
_free = fn("hr_tokenizer_free", [_P], None)
_encode = fn("hr_tokenizer_encode", [_P, ctypes.c_char_p, _SZ, ctypes.c_bool, ctypes.POINTER(_I32P), ctypes.POINTER(_SZ)])


_OFFSETS_CHARS = 1


class _Offset(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint32), ("end", ctypes.c_uint32)]


_encode_offsets = fn("hr_tokenizer_encode_offsets", [_P, ctypes.c_char_p, _SZ, ctypes.c_bool, ctypes.c_int,
                                                     ctypes.POINTER(_I32P),
                                                     ctypes.POINTER(ctypes.POINTER(_Offset)), ctypes.POINTER(_SZ)])
_encode_pair = fn("hr_tokenizer_encode_pair", [_P, ctypes.c_char_p, _SZ, ctypes.c_char_p, _SZ, ctypes.c_bool,
                                               ctypes.POINTER(_I32P), ctypes.POINTER(_I32P), ctypes.POINTER(_SZ)])
_encode_batch = fn("hr_tokenizer_encode_batch",
                   [_P, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_SZ), _SZ, ctypes.c_bool, ctypes.c_int,
                    ctypes.POINTER(ctypes.POINTER(_I32P)), ctypes.POINTER(ctypes.POINTER(_SZ))])
_free_batch = fn("hr_tokenizer_free_batch", [ctypes.POINTER(_I32P), ctypes.POINTER(_SZ), _SZ], None)
_decode = fn("hr_tokenizer_decode", [_P, _I32P, _SZ, ctypes.c_bool, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_SZ)])
_free_array = fn("hr_tokenizer_free_array", [_P], None)
_vocab_size = fn("hr_tokenizer_vocab_size", [_P], _SZ)
_token_to_id = fn("hr_tokenizer_token_to_id", [_P, ctypes.c_char_p, _SZ, _I32P])
_id_to_token = fn("hr_tokenizer_id_to_token", [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_SZ)])
_is_special = fn("hr_tokenizer_is_special", [_P, ctypes.c_int32], ctypes.c_bool)
_special_ids = {k: fn(f"hr_tokenizer_{k}_id", [_P], ctypes.c_int32) for k in ("bos", "eos", "pad", "unk")}
_chat_template = fn("hr_tokenizer_chat_template", [_P], ctypes.c_char_p)
_model_type = fn("hr_tokenizer_model_type", [_P], ctypes.c_char_p)
_chat_render = fn("hr_chat_template_render", [ctypes.c_char_p, _SZ, ctypes.c_char_p, _SZ,
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_SZ)])
_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [ctypes.c_void_p]
_libc_free.restype = None
_detok_init = fn("hr_detokenizer_init", [_P, ctypes.c_bool, ctypes.POINTER(_P)])
_detok_push = fn("hr_detokenizer_push", [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_SZ)])
_detok_flush = fn("hr_detokenizer_flush", [_P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_SZ)])
_detok_free = fn("hr_detokenizer_free", [_P], None)


def clean_up_tokenization(text):
    """transformers' clean_up_tokenization: spaces before punctuation and
    English contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


# Names a message's reasoning comes under; transformers copies the first one set to
# `reasoning_content` (what most templates read) and `thinking` (what gpt-oss reads).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _plain(value):
    """Messages as transformers hands them to a template: plain JSON data, and the keys
    whose value is None dropped from each message."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _template_messages(conversation):
    out = []
    for message in conversation:
        message = {k: v for k, v in _plain(message).items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final_message(messages, template, field):
    """transformers' continue_final_message: the final message's `field` (or its last text
    part) marked with a tag, to cut the rendering at after rendering. Returns its text."""
    if not messages:
        raise ValueError("continue_final_message is set but the conversation is empty!")
    final = messages[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [f for f in _REASONING_FIELDS if messages[-1].get(f) == final]
    if not any(f in template for f in fields):
        raise ValueError(f'continue_final_message is set to "{field}" but this is not an accepted field in the '
                         "chat_template")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                return final
        raise ValueError("continue_final_message is set but we could not find any text to continue in the final "
                         "message!")
    for f in fields:
        messages[-1][f] = messages[-1][f] + _CONTINUE_TAG
    return final


def _cut_at_tag(rendered, final):
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat after "
                         "applying the chat template! This can happen if the chat template deletes portions of the "
                         "final message. Please verify the chat template and final message in your chat to ensure "
                         f"they are compatible.Final message to continue: {final.strip()}\nRendered chat:\n{rendered}")
    at = rendered.rindex(tag)
    if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space


def render_chat_template(template, conversation, tools=None, documents=None, add_generation_prompt=False,
                         continue_final_message=False, **kwargs):
    """Renders a Hugging Face chat template (Jinja2 text) in C, with the variables
    transformers' render_jinja_template passes: messages, tools, documents,
    add_generation_prompt and the keyword arguments (special tokens, enable_thinking, ...).
    continue_final_message (True or a field name) ends the text inside the final message,
    as transformers does. strftime_now reads the clock unless $HUBRT_CHAT_DATE fixes it."""
    messages = _template_messages(conversation)
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = _tag_final_message(messages, template, field)
    context = {**{k: _plain(v) for k, v in kwargs.items()}, "messages": messages,
               "tools": _plain(tools), "documents": _plain(documents),
               "add_generation_prompt": bool(add_generation_prompt)}
    data = template.encode()
    ctx = json.dumps(context, ensure_ascii=False, allow_nan=True).encode()
    out, n = ctypes.c_void_p(), _SZ()
    check(_chat_render(data, len(data), ctx, len(ctx), ctypes.byref(out), ctypes.byref(n)))
    try:
        text = ctypes.string_at(out, n.value).decode("utf-8", "surrogateescape")
    finally:
        _libc_free(out)
    return _cut_at_tag(text, final) if final is not None else text


class Tokenizer:
    """A loaded tokenizer.json. Use AutoTokenizer.from_pretrained."""

    def __init__(self, handle, config=None):
        self._h = handle
        self._config = config or {}

    @classmethod
    def from_file(cls, path):
        h = _P()
        check(_load(os.fsencode(path), ctypes.byref(h)))
        config = {}
        cfg = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "tokenizer_config.json")
        if os.path.exists(cfg):
            with open(cfg, encoding="utf-8") as f:
                config = json.load(f)
        return cls(h, config)

    @classmethod
    def from_str(cls, text):
        data = text.encode() if isinstance(text, str) else text
        h = _P()
        check(_load_json(data, len(data), ctypes.byref(h)))
        return cls(h)

    def __del__(self, _free=_free):  # bound now: module globals are gone at exit
        if getattr(self, "_h", None):
            _free(self._h)
            self._h = None

    # ---- encoding ---------------------------------------------------------------
    def encode(self, text, add_special_tokens=True):
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        ids, n = _I32P(), _SZ()
        check(_encode(self._h, data, len(data), add_special_tokens, ctypes.byref(ids), ctypes.byref(n)))
        try:
            return ids[:n.value]
        finally:
            _free_array(ids)

    def encode_with_offsets(self, text, add_special_tokens=True):
        """(ids, offsets): offsets are (start, end) character positions in text,
        as tokenizers' Encoding.offsets; added special tokens get (0, 0)."""
        data = text.encode("utf-8", "surrogatepass")
        ids, offs, n = _I32P(), ctypes.POINTER(_Offset)(), _SZ()
        check(_encode_offsets(self._h, data, len(data), add_special_tokens, _OFFSETS_CHARS, ctypes.byref(ids),
                              ctypes.byref(offs), ctypes.byref(n)))
        try:
            return ids[:n.value], [(offs[i].start, offs[i].end) for i in range(n.value)]
        finally:
            _free_array(ids)
            _free_array(offs)

    def encode_pair(self, a, b, add_special_tokens=True):
        """(ids, type_ids) of a text pair, joined by the pair template."""
        da, db = a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
        ids, types, n = _I32P(), _I32P(), _SZ()
        check(_encode_pair(self._h, da, len(da), db, len(db), add_special_tokens, ctypes.byref(ids), ctypes.byref(types),
                           ctypes.byref(n)))
        try:
            return ids[:n.value], types[:n.value]
        finally:
            _free_array(ids)
            _free_array(types)

    def encode_batch(self, texts, add_special_tokens=True, num_threads=0):
        datas = [t.encode("utf-8", "surrogatepass") for t in texts]
        n = len(datas)
        arr = (ctypes.c_char_p * max(n, 1))(*datas)
        lens = (_SZ * max(n, 1))(*[len(d) for d in datas])
        ids, counts = ctypes.POINTER(_I32P)(), ctypes.POINTER(_SZ)()
        check(_encode_batch(self._h, arr, lens, n, add_special_tokens, num_threads, ctypes.byref(ids), ctypes.byref(counts)))
        try:
            return [ids[i][:counts[i]] for i in range(n)]
        finally:
            _free_batch(ids, counts, n)

    # ---- decoding -------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens=False):
        ids = [int(i) for i in ids]
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        out, n = ctypes.c_void_p(), _SZ()
        check(_decode(self._h, arr, len(ids), skip_special_tokens, ctypes.byref(out), ctypes.byref(n)))
        try:
            return ctypes.string_at(out, n.value).decode("utf-8")
        finally:
            _free_array(out)

    def stream(self, skip_special_tokens=False):
        """An incremental detokenizer: feed(id) -> new text, never half a character."""
        return Detokenizer(self, skip_special_tokens)

    # ---- vocabulary -------------------------------------------------------------------
    @property
    def vocab_size(self):
        return _vocab_size(self._h)

    def token_to_id(self, token):
        data = token.encode()
        v = ctypes.c_int32()
        return v.value if _token_to_id(self._h, data, len(data), ctypes.byref(v)) == 0 else None

    def id_to_token(self, i):
        p, n = ctypes.c_void_p(), _SZ()
        if _id_to_token(self._h, int(i), ctypes.byref(p), ctypes.byref(n)) != 0:
            return None
        return ctypes.string_at(p, n.value).decode("utf-8", "replace")

    def is_special(self, i):
        return bool(_is_special(self._h, int(i)))

    def special_id(self, kind):
        v = _special_ids[kind](self._h)
        return None if v < 0 else v

    @property
    def chat_template(self):
        t = _chat_template(self._h)
        return t.decode() if t is not None else None

    @property
    def model_type(self):
        return _model_type(self._h).decode()


class Detokenizer:
    def __init__(self, tok, skip_special_tokens=False):
        self._tok = tok
        self._h = _P()
        check(_detok_init(tok._h, skip_special_tokens, ctypes.byref(self._h)))

    def feed(self, token_id):
        p, n = ctypes.c_void_p(), _SZ()
        check(_detok_push(self._h, int(token_id), ctypes.byref(p), ctypes.byref(n)))
        return ctypes.string_at(p, n.value).decode("utf-8") if n.value else ""

    def flush(self):
        p, n = ctypes.c_void_p(), _SZ()
        check(_detok_flush(self._h, ctypes.byref(p), ctypes.byref(n)))
        return ctypes.string_at(p, n.value).decode("utf-8") if n.value else ""

    def __del__(self, _detok_free=_detok_free):
        if getattr(self, "_h", None):
            _detok_free(self._h)
            self._h = None


_NO_LIMIT = int(1e30)  # transformers' VERY_LARGE_INTEGER: no model_max_length
_LARGE = int(1e20)  # transformers' LARGE_INTEGER: a model_max_length from here on is no limit


class PreTrainedTokenizer:
    """The transformers-shaped face of a Tokenizer."""

    def __init__(self, tok):
        self._tok = tok
        # As transformers 5: the clean-up is never applied to BPE models.
        self.clean_up_tokenization_spaces = (bool(tok._config.get("clean_up_tokenization_spaces", False))
                                             and tok.model_type != "BPE")
        self.padding_side = tok._config.get("padding_side", "right")
        self.truncation_side = tok._config.get("truncation_side", "right")
        self.model_max_length = int(tok._config.get("model_max_length") or _NO_LIMIT)

    @property
    def backend(self):
        return self._tok

    def __call__(self, text, add_special_tokens=True, return_tensors=None, padding=False, truncation=None,
                 max_length=None, pad_to_multiple_of=None, padding_side=None, return_offsets_mapping=False):
        """transformers' call: padding True/"longest" (to the batch's longest),
        "max_length" or False; truncation True/"longest_first"/"only_first"
        to max_length (the tokenizer's model_max_length when None), the
        added special tokens kept; padding_side and truncation_side as the
        attributes (from tokenizer_config.json) or padding_side here."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        padding, truncation, max_length = self._strategies(padding, truncation, max_length)
        if truncation and padding != "do_not_pad" and pad_to_multiple_of and max_length % pad_to_multiple_of:
            raise ValueError(f"Truncation and padding are both activated but truncation length ({max_length}) is not "
                             f"a multiple of pad_to_multiple_of ({pad_to_multiple_of})")
        if return_offsets_mapping:
            pairs = [self._tok.encode_with_offsets(t, add_special_tokens) for t in texts]
            seqs, offsets = [list(p[0]) for p in pairs], [p[1] for p in pairs]
        else:
            seqs, offsets = self._tok.encode_batch(texts, add_special_tokens), None
        if truncation:
            keep = [self._kept(t, s, max_length, add_special_tokens) for t, s in zip(texts, seqs)]
            seqs = [[s[i] for i in k] for s, k in zip(seqs, keep)]
            if offsets is not None:
                offsets = [[o[i] for i in k] for o, k in zip(offsets, keep)]
        masks = [[1] * len(s) for s in seqs]
        if padding != "do_not_pad":
            if self.pad_token_id is None:  # as transformers, even with nothing to pad
                raise ValueError("Asking to pad but the tokenizer has no padding token (tokenizer_config.json "
                                 "names none)")
            width = max_length if padding == "max_length" else max((len(s) for s in seqs), default=0)
            if width and pad_to_multiple_of:
                width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
            side = padding_side or self.padding_side
            if side not in ("left", "right") and any(len(s) < width for s in seqs):
                raise ValueError(f"padding_side must be 'left' or 'right', not {side!r}")

            def pad(row, fill):
                extra = [fill] * (width - len(row))
                return extra + list(row) if side == "left" else list(row) + extra
            seqs = [pad(s, self.pad_token_id) for s in seqs]
            masks = [pad(m, 0) for m in masks]
            if offsets is not None:
                offsets = [pad(o, (0, 0)) for o in offsets]
        out = {"input_ids": seqs[0] if single else seqs, "attention_mask": masks[0] if single else masks}
        if offsets is not None:
            out["offset_mapping"] = offsets[0] if single else offsets
        if return_tensors == "np":
            import numpy as np
            out = {k: np.array([v] if single else v, dtype=np.int64) for k, v in out.items()}
        elif return_tensors == "pt":
            import torch
            out = {k: torch.tensor([v] if single else v, dtype=torch.long) for k, v in out.items()}
        return out

    def _strategies(self, padding, truncation, max_length):
        """(padding, truncation, max_length) as transformers resolves them."""
        if truncation is None and max_length is not None and padding is False:
            truncation = True  # transformers warns and truncates (longest_first)
        padding = {True: "longest", False: "do_not_pad", None: "do_not_pad"}.get(padding, padding)
        if padding not in ("longest", "max_length", "do_not_pad"):
            raise ValueError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', not {padding!r}")
        if truncation in (None, False, "do_not_truncate"):
            truncation = False
        elif truncation in (True, "longest_first", "only_first"):
            truncation = True
        else:
            raise ValueError(f"truncation {truncation!r} is not supported for single sequences")
        if max_length is None and (truncation or padding == "max_length"):
            if self.model_max_length >= _LARGE:  # no limit to pad or cut to: transformers warns and does neither
                return ("do_not_pad" if padding == "max_length" else padding), False, None
            max_length = self.model_max_length
        return padding, truncation, max_length

    def _kept(self, text, ids, max_length, add_special_tokens):
        """Positions of ids kept under truncation to max_length: the added
        special tokens stay and the text's tokens are cut from the
        truncation side, as the tokenizers library truncates before the
        post-processor adds them."""
        if len(ids) <= max_length:
            return range(len(ids))
        body = self._tok.encode(text, False) if add_special_tokens else ids
        start = next((p for p in range(len(ids) - len(body) + 1) if ids[p:p + len(body)] == body), None)
        if start is None:  # the template changed the text's tokens: cut the whole sequence
            start, body = 0, ids
        room = max_length - (len(ids) - len(body))
        if room < 0:  # shorter than the added special tokens alone: the tokenizers library leaves it whole
            return range(len(ids))
        if self.truncation_side not in ("left", "right"):
            raise ValueError(f"truncation_side must be 'left' or 'right', not {self.truncation_side!r}")
        cut = range(start, start + room) if self.truncation_side == "right" else \
            range(start + len(body) - room, start + len(body))
        return list(range(start)) + list(cut) + list(range(start + len(body), len(ids)))

    def encode(self, text, add_special_tokens=True):
        return self._tok.encode(text, add_special_tokens)

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        text = self._tok.decode(ids, skip_special_tokens)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        return clean_up_tokenization(text) if clean else text

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(i) for i in ids]

    def __len__(self):
        return self._tok.vocab_size

    @property
    def vocab_size(self):
        return self._tok.vocab_size

    bos_token_id = property(lambda self: self._tok.special_id("bos"))
    eos_token_id = property(lambda self: self._tok.special_id("eos"))
    pad_token_id = property(lambda self: self._tok.special_id("pad"))
    unk_token_id = property(lambda self: self._tok.special_id("unk"))
    chat_template = property(lambda self: self._tok.chat_template)

    @property
    def special_tokens_map(self):
        """bos_token, eos_token, ... as strings, as transformers' special_tokens_map (the
        tokens tokenizer_config.json names; a null one is left out)."""
        out = {}
        for kind in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
            key = f"{kind}_token"
            v = self._tok._config.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if key not in self._tok._config and kind in ("bos", "eos", "pad", "unk"):
                i = self._tok.special_id(kind)
                v = self._tok.id_to_token(i) if i is not None else None
            if v is not None:
                out[key] = str(v)
        return out

    def get_chat_template(self, chat_template=None, tools=None):
        """transformers' choice of template: the one given (a name picks from a list of named
        templates), else tokenizer_config.json's; from a list, "tool_use" when tools are
        passed and there is one, else "default"."""
        templates = self._tok._config.get("chat_template")
        if isinstance(templates, list):
            named = {t["name"]: t["template"] for t in templates}
            if chat_template is not None:
                return named.get(chat_template, chat_template)
            if tools is not None and "tool_use" in named:
                return named["tool_use"]
            if "default" in named:
                return named["default"]
            raise ValueError("this tokenizer has several chat templates and none is named 'default'; pass "
                             f"chat_template= one of {sorted(named)}")
        if chat_template is not None:
            return chat_template
        template = self._tok.chat_template  # chat_template.jinja's when there is one, as transformers reads it
        if template is None:
            raise ValueError("this tokenizer has no chat template: pass chat_template=")
        return template

    def apply_chat_template(self, conversation, tools=None, documents=None, chat_template=None,
                            add_generation_prompt=False, continue_final_message=False, tokenize=True, padding=False,
                            truncation=False, max_length=None, return_tensors=None, return_dict=True, **kwargs):
        """transformers' apply_chat_template (5.x): one conversation or a list of them
        rendered in C; tokenize=False gives the text, else the tokenizer's call on it
        without added special tokens (a dict with input_ids and attention_mask, or with
        return_dict=False the ids alone). Extra keyword arguments (enable_thinking=, ...)
        reach the template and override the special tokens of the same name;
        continue_final_message ends the text inside the final message."""
        for name in ("sanitize_control_tokens", "return_assistant_tokens_mask"):
            if kwargs.pop(name, False):
                raise ValueError(f"hubrt's apply_chat_template does not support {name}=True")
        kwargs.pop("tokenizer_kwargs", None)
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible. Use "
                             "continue_final_message when you want the model to continue the final message, and "
                             "add_generation_prompt when you want to add a header that will prompt it to start a "
                             "new assistant message instead.")
        if isinstance(conversation, (list, tuple)) and not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        batched = isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
        chats = [getattr(c, "messages", c) for c in conversation] if batched else [conversation]
        template = self.get_chat_template(chat_template, tools)
        texts = [render_chat_template(template, c, tools=tools, documents=documents,
                                      add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message,
                                      **{**self.special_tokens_map, **kwargs}) for c in chats]
        text = texts if batched else texts[0]
        if not tokenize:
            return text
        out = self(text, add_special_tokens=False, padding=padding, truncation=truncation or None,
                   max_length=max_length, return_tensors=return_tensors)
        return out if return_dict else out["input_ids"]

class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, **kwargs):
        """Loads tokenizer.json (+ tokenizer_config.json) from a model folder, a file, or a Hub
        repository id (revision=, cache_dir=, token=, local_files_only= as transformers takes them)."""
        from .hub import HUB_ARGS, resolve
        hub_args = {k: kwargs.pop(k) for k in HUB_ARGS if k in kwargs}
        return PreTrainedTokenizer(Tokenizer.from_file(resolve(path, **hub_args)))
