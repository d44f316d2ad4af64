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
    _fields_ = [("dtype", ctypes.c_char_p), ("device", ctypes.c_char_p),
                ("experts_implementation", ctypes.c_char_p), ("dequantize", ctypes.c_bool),
                ("quantize", ctypes.c_char_p), ("tp_size", ctypes.c_int64), ("tp_plan", ctypes.c_char_p),
                ("ep_size", ctypes.c_int64)]


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
                ("token_text", _P), ("on_token", _P), ("ctx", _P), ("compile", ctypes.c_bool),
                ("no_repeat_ngram_size", ctypes.c_int64), ("bad_words", _I64P), ("bad_word_lens", _I64P),
                ("n_bad_words", ctypes.c_int), ("min_new_tokens", ctypes.c_int64), ("on_step", _P),
                ("want_scores", ctypes.c_bool)]


_F32P = ctypes.POINTER(ctypes.c_float)
_ON_STEP = ctypes.CFUNCTYPE(ctypes.c_bool, _P, _I64P, _F32P, _F32P, ctypes.c_int64, ctypes.c_int64)
_TOKEN_TEXT = ctypes.CFUNCTYPE(ctypes.c_void_p, _P, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_size_t))

# transformers' generate() arguments hubrt takes beyond its signature's; any other is refused by name
_GENERATE_ARGS = {"min_new_tokens", "no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "max_length",
                  "use_cache", "stop_strings", "tokenizer"}


class GenerateDecoderOnlyOutput(dict):
    """transformers' return_dict_in_generate result: sequences, and scores
    and logits (tuples of [batch, vocab] per step) when asked for; read as
    attributes or keys, as transformers' ModelOutput is."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


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
_mweights = fn("hr_model_weight_types", [_P], ctypes.c_char_p)
_vocab = fn("hr_model_vocab_size", [_P], ctypes.c_int64)
_set_experts = fn("hr_model_set_experts_implementation", [_P, ctypes.c_char_p])
_get_experts = fn("hr_model_experts_implementation", [_P], ctypes.c_char_p)
_set_experts_kernel = fn("hr_model_set_experts_kernel", [_P, ctypes.c_int64, ctypes.c_bool])
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

    def __init__(self, handle, path, split=False):
        self._h = handle
        self.name_or_path = str(path)
        self._split = split  # over the ranks of a process group (tp_size or ep_size > 1)

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
    def weight_types(self):
        """The dtypes the weights are held in: ["f32", "q8_0", "q4_1"] for the
        demo's Q4_1 file kept in its blocks."""
        return _mweights(self._h).decode().split(",")

    @property
    def vocab_size(self):
        return _vocab(self._h)

    def set_experts_implementation(self, name):
        """As transformers' model.set_experts_implementation: "grouped" (also
        "grouped_mm", "batched_mm"), "eager", a kernel repository "org/name"
        ("org/name@v1") or a Kernel from hubrt.get_kernel."""
        from .kernels import Kernel
        if isinstance(name, Kernel):
            check(_set_experts_kernel(self._h, name.impl_id, False))
        else:
            check(_set_experts(self._h, name.encode()))

    @property
    def experts_implementation(self):
        return _get_experts(self._h).decode()

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

    def generate(self, input_ids=None, attention_mask=None, max_new_tokens=None, do_sample=None,
                 temperature=None, top_k=None, top_p=None, min_p=None, repetition_penalty=None,
                 eos_token_id=None, pad_token_id=None, seed=None, prefill_chunk=None, return_stats=False,
                 cache_implementation=None, generation_config=None, streamer=None, return_dict_in_generate=None,
                 output_scores=None, output_logits=None, **kwargs):
        """Ids [batch, seq + new] with the prompt, as transformers returns
        them (finished rows padded with pad_token_id). Unset arguments take
        generation_config.json's values. Padding must be on the left.
        cache_implementation="static" runs the compiled forward, as
        transformers' static cache + torch.compile does: prefill chunks of
        power-of-two sizes and one decode step, each compiled once and
        replayed (see hubrt.compile_stats()).
        hubrt's own: seed (sampling), prefill_chunk (prompt tokens per row
        per prefill step, default 512), return_stats.
        Also transformers': min_new_tokens, no_repeat_ngram_size,
        bad_words_ids, num_return_sequences, max_length, a
        generation_config (a GenerationConfig or a dict; arguments win over
        it), streamer (put/end, as TextStreamer and TextIteratorStreamer
        take them), return_dict_in_generate with output_scores and
        output_logits. Any other argument is refused by name."""
        if input_ids is None and "inputs" in kwargs:
            input_ids = kwargs.pop("inputs")
        gc = {}
        if generation_config is not None:  # its values stand in for the arguments left unset
            gc = generation_config if isinstance(generation_config, dict) else generation_config.to_diff_dict()
            gc = {k: v for k, v in gc.items() if v is not None}
        given = {**{k: v for k, v in gc.items() if k in _GENERATE_ARGS}, **kwargs}
        unknown = sorted(set(given) - _GENERATE_ARGS)
        if unknown:
            raise ValueError(f"hubrt's generate does not support {', '.join(unknown)} (it takes "
                             f"{', '.join(sorted(_GENERATE_ARGS))} and the arguments in its signature)")

        def unset(name, value):
            return gc.get(name) if value is None else value
        max_new_tokens, do_sample = unset("max_new_tokens", max_new_tokens), unset("do_sample", do_sample)
        temperature, top_k, top_p = unset("temperature", temperature), unset("top_k", top_k), unset("top_p", top_p)
        min_p, repetition_penalty = unset("min_p", min_p), unset("repetition_penalty", repetition_penalty)
        eos_token_id, pad_token_id = unset("eos_token_id", eos_token_id), unset("pad_token_id", pad_token_id)
        want_dict = bool(unset("return_dict_in_generate", return_dict_in_generate))
        want_scores = bool(unset("output_scores", output_scores))
        want_logits = bool(unset("output_logits", output_logits))
        n_ret = int(given.pop("num_return_sequences", 1) or 1)
        if n_ret > 1 and not (do_sample if do_sample is not None else self.generation_config["do_sample"]):
            raise ValueError("num_return_sequences > 1 needs do_sample=True (hubrt has no beam search)")
        if cache_implementation not in (None, "dynamic", "static"):
            raise ValueError(f"cache_implementation must be None, 'dynamic' or 'static', "
                             f"not {cache_implementation!r}")
        ids, was_torch = _as_ids(input_ids, "input_ids")
        if n_ret > 1:  # each prompt n_ret times, one after another, as transformers expands them
            ids = np.ascontiguousarray(np.repeat(ids, n_ret, axis=0))
            if attention_mask is not None:
                attention_mask = np.repeat(_as_ids(attention_mask, "attention_mask")[0], n_ret, axis=0)
        b, s = ids.shape
        max_length = given.pop("max_length", None)
        if max_new_tokens is None and max_length is not None:
            max_new_tokens = int(max_length) - s
        given.pop("use_cache", None)
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
        if seed is not None:
            cfg.seed = int(seed) % 2**64
        elif self._split:
            from . import distributed
            cfg.seed = distributed.shared_seed()  # rank 0's: every rank must draw alike
        else:
            cfg.seed = int.from_bytes(os.urandom(8), "little")
        eos_arr = None
        if eos_token_id is not None:
            eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
            eos_arr = (ctypes.c_int64 * max(len(eos), 1))(*eos)
            cfg.eos_ids = ctypes.cast(eos_arr, _I64P)
            cfg.n_eos = len(eos)
        cfg.pad_id = -1 if pad_token_id is None else int(pad_token_id)
        cfg.prefill_chunk = 0 if prefill_chunk is None else int(prefill_chunk)
        cfg.compile = cache_implementation == "static"
        cfg.min_new_tokens = int(given.pop("min_new_tokens", 0) or 0)
        cfg.no_repeat_ngram_size = int(given.pop("no_repeat_ngram_size", 0) or 0)
        bad = given.pop("bad_words_ids", None)
        bad_arrays = None
        if bad:
            if not all(isinstance(w, (list, tuple)) and w and all(isinstance(i, int) and i >= 0 for i in w)
                       for w in bad):
                raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, not {bad!r}")
            flat = [i for w in bad for i in w]
            bad_arrays = ((ctypes.c_int64 * len(flat))(*flat), (ctypes.c_int64 * len(bad))(*[len(w) for w in bad]))
            cfg.bad_words = ctypes.cast(bad_arrays[0], _I64P)
            cfg.bad_word_lens = ctypes.cast(bad_arrays[1], _I64P)
            cfg.n_bad_words = len(bad)
        steps_scores, steps_logits, error = [], [], []
        stop_strings, tokenizer = given.pop("stop_strings", None), given.pop("tokenizer", None)
        keep = []  # what C holds pointers into during the call
        if stop_strings:
            if tokenizer is None:
                raise ValueError("stop_strings needs the model's tokenizer: generate(..., stop_strings=..., "
                                 "tokenizer=tokenizer), as transformers asks")
            stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
            stop_arr = (ctypes.c_char_p * len(stops))(*[x.encode() for x in stops])
            new_ids, shown, last = {}, {}, [None]

            def token_text(ctx, row, tok, n):
                try:  # the text the row's new token adds: the decoded new tokens, less what was shown
                    ids_r = new_ids.setdefault(row, [])
                    ids_r.append(tok)
                    text = tokenizer.decode(ids_r)
                    prev = shown.get(row, "")
                    add = text[len(prev):] if text.startswith(prev) else text
                    shown[row] = text
                    last[0] = ctypes.create_string_buffer(add.encode("utf-8", "replace"))
                    n[0] = len(last[0].value)
                    return ctypes.addressof(last[0])
                except BaseException as e:
                    error.append(e)
                    n[0] = 0
                    return None
            text_cb = _TOKEN_TEXT(token_text)
            keep += [stop_arr, text_cb]
            cfg.stop_strings = stop_arr
            cfg.n_stop_strings = len(stops)
            cfg.token_text = ctypes.cast(text_cb, _P)

        def as_out(a):
            if was_torch:
                import torch
                return torch.from_numpy(a)
            return a

        def on_step(ctx, toks, raw, scores, nb, vocab):
            try:
                if streamer is not None:
                    streamer.put(as_out(np.ctypeslib.as_array(toks, (nb,)).copy()))
                if want_scores:
                    steps_scores.append(as_out(np.ctypeslib.as_array(scores, (nb, vocab)).copy()))
                if want_logits:
                    steps_logits.append(as_out(np.ctypeslib.as_array(raw, (nb, vocab)).copy()))
                return True
            except BaseException as e:  # raised again after the C call: a callback must not unwind C frames
                error.append(e)
                return False
        step_cb = None
        if streamer is not None or want_scores or want_logits:
            step_cb = _ON_STEP(on_step)
            cfg.on_step = ctypes.cast(step_cb, _P)
            cfg.want_scores = want_scores or want_logits
        if streamer is not None:
            streamer.put(as_out(ids.copy()))
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
        if error:
            raise error[0]
        if streamer is not None:
            streamer.end()
        res = out[:, :out_len.value]
        if was_torch:
            import torch
            res = torch.from_numpy(res.copy())
        if want_dict:
            res = GenerateDecoderOnlyOutput(sequences=res, scores=tuple(steps_scores) if want_scores else None,
                                            logits=tuple(steps_logits) if want_logits else None,
                                            past_key_values=None)
        if return_stats:
            return res, {"prompt_tokens": stats.prompt_tokens, "new_tokens": stats.new_tokens,
                         "prefill_s": stats.prefill_s, "decode_s": stats.decode_s,
                         "prefill_cpu_s": stats.prefill_cpu_s, "decode_cpu_s": stats.decode_cpu_s}
        return res


class AutoModelForCausalLM:
    """Picks the architecture from config.json, as transformers does."""

    @classmethod
    def from_pretrained(cls, path, dtype="auto", device_map="cpu", experts_implementation=None, dequantize=False,
                        quantize=None, distributed_config=None, tp_plan=None, **kwargs):
        """experts_implementation: a mixture-of-experts model's experts, "grouped"
        (the default; transformers' "grouped_mm" and "batched_mm" name it too),
        "eager" (transformers' per-expert loop), a kernel repository "org/name"
        or a Kernel from hubrt.get_kernel. dequantize: a GGUF file's
        block-quantized weights and an FP8 checkpoint's weights, kept in
        their blocks on the CPU by default, cast to dtype at load instead.
        quantize: "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k",
        "q5_k" or "q6_k": the float linear and embedding matrices quantized
        into it while loading (the CPU only). distributed_config: a
        hubrt.DistributedConfig(tp_size=N, tp_plan=...) splitting the model
        over the N processes of this MPI group (hubrt launch -n N); tp_plan
        alone ("auto" or a dict) means tp_size = the group's size."""
        hub_args = {k: kwargs.pop(k) for k in HUB_ARGS if k in kwargs}
        if kwargs:
            raise TypeError(f"unsupported arguments: {', '.join(sorted(kwargs))}")
        path = resolve(path, **hub_args)
        dt = str(dtype).replace("torch.", "") if dtype is not None else "auto"
        dev = device_map if isinstance(device_map, str) and device_map != "auto" else "cpu"
        from .kernels import Kernel
        impl = experts_implementation if isinstance(experts_implementation, str) else None
        tp_size, ep_size, plan = 1, 1, None
        if distributed_config is not None or tp_plan is not None:
            from . import distributed
            dc = distributed_config or distributed.DistributedConfig(tp_plan=tp_plan)
            distributed.init()
            tp_size = dc.tp_size if distributed_config is not None else distributed.size()
            ep_size = dc.experts_split() if distributed_config is not None else 1
            plan = dc.plan_json()
        opts = _ModelOptions(dtype=dt.encode(), device=dev.encode(), experts_implementation=impl.encode() if impl else None,
                             dequantize=bool(dequantize), quantize=quantize.encode() if quantize else None,
                             tp_size=tp_size, tp_plan=plan.encode() if plan else None, ep_size=ep_size)
        h = _P()
        check(_load(os.fspath(path).encode(), ctypes.byref(opts), ctypes.byref(h)))
        model = HubrtModelForCausalLM(h, path, split=tp_size > 1 or ep_size > 1)
        if isinstance(experts_implementation, Kernel):
            model.set_experts_implementation(experts_implementation)
        return model
