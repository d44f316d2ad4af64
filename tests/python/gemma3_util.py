"""Tiny Gemma 3 checkpoints made with transformers for test_gemma3.py, and
the comparison helpers it shares.

Weights are redrawn so that a wrong detail shows: every parameter of rank
<= 1 (the zero-centred norms, biases) gets N(0, 0.1) added, so a norm read
as w instead of 1 + w, or a bias left out, moves the logits; matrices are
N(0, 1/fan_in), so the logits are peaked and greedy choices are not
near-ties. A tied model's embedding is N(0, 0.3) (logits spread over ~25);
an untied one's is N(0, 1) with a head of N(0, 4/hidden): a tied random
model mostly predicts its own input token back, which would make greedy
generation blind to attention, an untied one writes varied text."""
import ctypes
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM as HFModel
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import hubrt
from hubrt._lib import check, fn

# hidden 64, 4 heads of 16 over 2 KV heads, window 8, layers S F S F
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=512,
            sliding_window=8, sliding_window_pattern=2, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1,
            pad_token_id=0)


def rel_err(got, want):
    """max |got - want| over the span of want: the tests' bound is 1e-4."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / (want.max() - want.min()))


def random_ids(shape, seed=0, vocab=256):
    return np.random.default_rng(seed).integers(3, vocab, shape)


def redraw(model, seed):
    """The weights described in the module docstring, in place."""
    g = torch.Generator().manual_seed(seed)
    tied = model.config.get_text_config().tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim <= 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_((0.3 if tied else 1.0) * torch.randn(p.shape, generator=g))
            elif name.endswith("lm_head.weight"):
                if not tied:
                    p.copy_(2.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model


def text_config(**overrides):
    return Gemma3TextConfig(**{**BASE, **overrides})


def save_causal(path, seed=0, dtype=None, **overrides):
    """A Gemma3ForCausalLM of BASE + overrides, saved to path."""
    torch.manual_seed(seed)
    model = redraw(Gemma3ForCausalLM(text_config(**overrides)).eval(), seed)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    return Path(path)


def hf_model(path, dtype=torch.float32):
    m = HFModel.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    m.generation_config.eos_token_id = None  # all the tokens asked for
    return m


def hf_logits(model_or_path, ids, mask=None):
    m = hf_model(model_or_path) if isinstance(model_or_path, (str, Path)) else model_or_path
    with torch.no_grad():
        out = m(torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask)).logits
    return out.float().numpy()


def hf_greedy(model_or_path, ids, n, mask=None, **kw):
    m = hf_model(model_or_path) if isinstance(model_or_path, (str, Path)) else model_or_path
    out = m.generate(torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask),
                     max_new_tokens=n, do_sample=False, **kw)
    return out.numpy()


def need_xla():
    """Skips the test where the xla_cpu PJRT plugin is not installed."""
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        import pytest
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")


def hr_model(path, dtype="float32", device_map="cpu"):
    return hubrt.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map)


def read_config(path):
    return json.loads((Path(path) / "config.json").read_text())


def write_config(path, cfg):
    (Path(path) / "config.json").write_text(json.dumps(cfg, indent=1))


def edit_config(path, **changes):
    cfg = read_config(path)
    cfg.update(changes)
    write_config(path, cfg)


def edit_tensors(path, fn_):
    """Rewrites model.safetensors as fn_(dict of tensors) returns it."""
    f = Path(path) / "model.safetensors"
    save_file(fn_(load_file(f)), f, metadata={"format": "pt"})


# ---- hr_model_step: one eager or compiled step, as hr_generate runs them -----------------

_I64P = ctypes.POINTER(ctypes.c_int64)


class _StepArgs(ctypes.Structure):
    """hr_step_args (include/hubrt/model.h)."""
    _fields_ = [("ids", _I64P), ("pos", _I64P), ("mask", _I64P), ("batch", ctypes.c_int64),
                ("seq", ctypes.c_int64), ("cache", ctypes.c_void_p), ("compiled", ctypes.c_bool)]


_step = fn("hr_model_step", [ctypes.c_void_p, ctypes.POINTER(_StepArgs), ctypes.POINTER(ctypes.c_void_p)])


def model_step(model, cache, ids, start, compiled):
    """The last position's logits [batch, vocab] (float32) after feeding
    ids [batch, seq] at positions start.. into cache."""
    ids = np.ascontiguousarray(ids, np.int64)
    b, s = ids.shape
    pos = np.ascontiguousarray(np.broadcast_to(np.arange(start, start + s), (b, s)), np.int64)
    args = _StepArgs(ids=ids.ctypes.data_as(_I64P), pos=pos.ctypes.data_as(_I64P), mask=None, batch=b, seq=s,
                     cache=cache._h, compiled=compiled)
    out = ctypes.c_void_p()
    check(_step(model._h, ctypes.byref(args), ctypes.byref(out)))
    return hubrt.Tensor(out).numpy().astype(np.float32).reshape(b, -1)  # bf16 widened
