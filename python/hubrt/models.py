"""transformers-shaped causal LMs over libhubrt:

    model = hubrt.AutoModelForCausalLM.from_pretrained(path, dtype="bfloat16")
    logits = model(input_ids, attention_mask=mask).logits     # numpy [b, s, vocab]
    ids = model.generate(input_ids, max_new_tokens=32)        # prompt included

Inputs may be lists, numpy arrays or torch tensors; generate returns the
same kind it was given (torch in, torch out; numpy otherwise)."""
import ctypes
import os

import numpy as np

from ._lib import check, fn
from .hub import HUB_ARGS, resolve
from .tensor import Tensor, from_numpy

_P = ctypes.c_void_p
_I64P = ctypes.POINTER(ctypes.c_int64)


class _ModelOptions(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_char_p), ("device", ctypes.c_char_p)]


class _ForwardArgs(ctypes.Structure):
    _fields_ = [("input_ids", _P), ("attention_mask", _P), ("positions", _P), ("cache", _P),
                ("last_only", ctypes.c_bool)]


class _GenerateConfig(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int64), ("do_sample", ctypes.c_bool),
                ("temperature", ctypes.c_double), ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double),
                ("min_p", ctypes.c_double), ("repetition_penalty", ctypes.c_double),
                ("seed", ctypes.c_uint64), ("eos_ids", _I64P), ("n_eos", ctypes.c_int),
                ("pad_id", ctypes.c_int64), ("prefill_chunk", ctypes.c_int64),
                ("stop_strings", ctypes.POINTER(ctypes.c_char_p)), ("n_stop_strings", ctypes.c_int),
                ("token_text", _P), ("on_token", _P), ("ctx", _P), ("compile", ctypes.c_bool)]


class _GenerationConfig(ctypes.Structure):
    """hr_generation_config (include/hubrt/io.h)."""
    _fields_ = [("bos_token_id", ctypes.c_int64), ("pad_token_id", ctypes.c_int64),
                ("eos_token_ids", ctypes.c_int64 * 16), ("n_eos", ctypes.c_int),
                ("max_length", ctypes.c_int64), ("max_new_tokens", ctypes.c_int64),
                ("do_sample", ctypes.c_bool), ("temperature", ctypes.c_double), ("top_k", ctypes.c_int64),
                ("top_p", ctypes.c_double), ("min_p", ctypes.c_double),
                ("repetition_penalty", ctypes.c_double)]


class _GenerateStats(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int64), ("new_tokens", ctypes.c_int64),
                ("prefill_s", ctypes.c_double), ("decode_s", ctypes.c_double),
                ("prefill_cpu_s", ctypes.c_double), ("decode_cpu_s", ctypes.c_double)]


_load = fn("hr_model_load", [ctypes.c_char_p, ctypes.POINTER(_ModelOptions), ctypes.POINTER(_P)])
_free = fn("hr_model_free", [_P], None)
_forward = fn("hr_model_forward", [_P, ctypes.POINTER(_ForwardArgs), ctypes.POINTER(_P)])
_arch = fn("hr_model_arch", [_P], ctypes.c_char_p)
_mdtype = fn("hr_model_dtype", [_P])
_vocab = fn("hr_model_vocab_size", [_P], ctypes.c_int64)
_genconf = fn("hr_model_generation_config", [_P], ctypes.POINTER(_GenerationConfig))
_gen_init = fn("hr_generate_config_init", [ctypes.POINTER(_GenerateConfig)], None)
_generate = fn("hr_generate", [_P, _I64P, _I64P, ctypes.c_int64, ctypes.c_int64,
                               ctypes.POINTER(_GenerateConfig), _I64P, _I64P,
                               ctypes.POINTER(_GenerateStats)])
_cache_create = fn("hr_kv_cache_create", [_P, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(_P)])
_cache_free = fn("hr_kv_cache_free", [_P], None)


def _as_ids(x, name):
    """(2-D int64 numpy array, was_torch) from a list, numpy array or torch tensor."""
    is_torch = type(x).__module__.startswith("torch")
    a = np.asarray(x.detach().cpu() if is_torch else x)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{name} must be [batch, seq], got shape {a.shape}")
    return np.ascontiguousarray(a, dtype=np.int64), is_torch


class CausalLMOutput:
    """What calling the model returns: .logits, float32 numpy [batch, seq, vocab]."""

    def __init__(self, logits):
        self.logits = logits

    def __getitem__(self, key):
        return {"logits": self.logits}[key] if isinstance(key, str) else (self.logits,)[key]


class KVCache:
    """A static KV cache [layer][batch, kv_heads, max_len, head_dim] to pass
    to successive model calls (past_key_values=cache)."""

    def __init__(self, model, batch, max_len):
        self._h = _P()
        check(_cache_create(model._h, batch, max_len, ctypes.byref(self._h)))
        self._model = model

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            _cache_free(self._h)
            self._h = _P()


class HubrtModelForCausalLM:
    """A loaded causal LM. Use AutoModelForCausalLM.from_pretrained."""

    def __init__(self, handle, path):
        self._h = handle
        self.name_or_path = str(path)

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            _free(self._h)
            self._h = _P()

    @property
    def architecture(self):
        return _arch(self._h).decode()

    @property
    def dtype(self):
        from .tensor import DTYPES
        return DTYPES[_mdtype(self._h)]

    @property
    def vocab_size(self):
        return _vocab(self._h)

    @property
    def generation_config(self):
        """generation_config.json's defaults (config.json's ids merged) as a dict."""
        g = _genconf(self._h).contents
        return {"bos_token_id": g.bos_token_id if g.bos_token_id >= 0 else None,
                "pad_token_id": g.pad_token_id if g.pad_token_id >= 0 else None,
                "eos_token_id": [g.eos_token_ids[i] for i in range(g.n_eos)],
                "max_length": g.max_length,
                "max_new_tokens": g.max_new_tokens if g.max_new_tokens >= 0 else None,
                "do_sample": g.do_sample, "temperature": g.temperature, "top_k": g.top_k,
                "top_p": g.top_p, "min_p": g.min_p or None, "repetition_penalty": g.repetition_penalty}

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                 logits_to_keep=0):
        """Logits for every position ([b, s, vocab]), or the last
        `logits_to_keep` = 1. With past_key_values (a KVCache) the tokens
        extend it and attention_mask covers cached + new tokens."""
        ids, _ = _as_ids(input_ids, "input_ids")
        if logits_to_keep not in (0, 1):
            raise ValueError("logits_to_keep must be 0 (all) or 1 (last)")
        keep = [from_numpy(ids)]
        args = _ForwardArgs(input_ids=keep[0].handle, last_only=logits_to_keep == 1)
        if attention_mask is not None:
            keep.append(from_numpy(_as_ids(attention_mask, "attention_mask")[0]))
            args.attention_mask = keep[-1].handle
        if position_ids is not None:
            keep.append(from_numpy(_as_ids(position_ids, "position_ids")[0]))
            args.positions = keep[-1].handle
        if past_key_values is not None:
            args.cache = past_key_values._h
        out = _P()
        check(_forward(self._h, ctypes.byref(args), ctypes.byref(out)))
        return CausalLMOutput(Tensor(out).numpy())

    forward = __call__

    def generate(self, input_ids, attention_mask=None, max_new_tokens=None, do_sample=None,
                 temperature=None, top_k=None, top_p=None, min_p=None, repetition_penalty=None,
                 eos_token_id=None, pad_token_id=None, seed=None, prefill_chunk=None, return_stats=False,
                 cache_implementation=None):
        """Ids [batch, seq + new] with the prompt, as transformers returns
        them (finished rows padded with pad_token_id). Unset arguments take
        generation_config.json's values. Padding must be on the left.
        cache_implementation="static" runs the compiled forward, as
        transformers' static cache + torch.compile does: prefill chunks of
        power-of-two sizes and one decode step, each compiled once and
        replayed (see hubrt.compile_stats()).
        hubrt's own: seed (sampling), prefill_chunk (prompt tokens per row
        per prefill step, default 512), return_stats."""
        if cache_implementation not in (None, "dynamic", "static"):
            raise ValueError(f"cache_implementation must be None, 'dynamic' or 'static', "
                             f"not {cache_implementation!r}")
        ids, was_torch = _as_ids(input_ids, "input_ids")
        b, s = ids.shape
        g = self.generation_config
        if max_new_tokens is None:
            max_new_tokens = g["max_new_tokens"] if g["max_new_tokens"] is not None else g["max_length"] - s
        cfg = _GenerateConfig()
        _gen_init(ctypes.byref(cfg))
        cfg.max_new_tokens = int(max_new_tokens)
        cfg.do_sample = bool(g["do_sample"] if do_sample is None else do_sample)
        cfg.temperature = float(g["temperature"] if temperature is None else temperature)
        cfg.top_k = int(g["top_k"] if top_k is None else top_k)
        cfg.top_p = float(g["top_p"] if top_p is None else top_p)
        cfg.min_p = float((g["min_p"] or 0.0) if min_p is None else min_p)
        cfg.repetition_penalty = float(g["repetition_penalty"] if repetition_penalty is None
                                       else repetition_penalty)
        cfg.seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed) % 2**64
        eos_arr = None
        if eos_token_id is not None:
            eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
            eos_arr = (ctypes.c_int64 * max(len(eos), 1))(*eos)
            cfg.eos_ids = ctypes.cast(eos_arr, _I64P)
            cfg.n_eos = len(eos)
        cfg.pad_id = -1 if pad_token_id is None else int(pad_token_id)
        cfg.prefill_chunk = 0 if prefill_chunk is None else int(prefill_chunk)
        cfg.compile = cache_implementation == "static"
        mask_p = None
        if attention_mask is not None:
            mask = _as_ids(attention_mask, "attention_mask")[0]
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
            mask_p = mask.ctypes.data_as(_I64P)
        out = np.zeros((b, s + max(int(max_new_tokens), 0)), dtype=np.int64)
        out_len = ctypes.c_int64()
        stats = _GenerateStats()
        check(_generate(self._h, ids.ctypes.data_as(_I64P), mask_p, b, s, ctypes.byref(cfg),
                        out.ctypes.data_as(_I64P), ctypes.byref(out_len), ctypes.byref(stats)))
        res = out[:, :out_len.value]
        if was_torch:
            import torch
            res = torch.from_numpy(res.copy())
        if return_stats:
            return res, {"prompt_tokens": stats.prompt_tokens, "new_tokens": stats.new_tokens,
                         "prefill_s": stats.prefill_s, "decode_s": stats.decode_s,
                         "prefill_cpu_s": stats.prefill_cpu_s, "decode_cpu_s": stats.decode_cpu_s}
        return res


class AutoModelForCausalLM:
    """Picks the architecture from config.json, as transformers does."""

    @classmethod
    def from_pretrained(cls, path, dtype="auto", device_map="cpu", **kwargs):
        hub_args = {k: kwargs.pop(k) for k in HUB_ARGS if k in kwargs}
        if kwargs:
            raise TypeError(f"unsupported arguments: {', '.join(sorted(kwargs))}")
        path = resolve(path, **hub_args)
        dt = str(dtype).replace("torch.", "") if dtype is not None else "auto"
        dev = device_map if isinstance(device_map, str) and device_map != "auto" else "cpu"
        opts = _ModelOptions(dtype=dt.encode(), device=dev.encode())
        h = _P()
        check(_load(os.fspath(path).encode(), ctypes.byref(opts), ctypes.byref(h)))
        return HubrtModelForCausalLM(h, path)
