"""Rope frequencies as transformers computes them (hr_rope_inv_freq).

    inv_freq, attention_scaling = hubrt.rope.inv_freq(
        rope_parameters, head_dim=128, max_position_embeddings=4096, seq_len=8192)

`rope_parameters` is the config's dict (transformers 5.x `rope_parameters`,
or a 4.x `rope_scaling` dict plus `rope_theta`), with the keys of
transformers' RopeParameters; absent keys take transformers' defaults."""
import ctypes

import numpy as np

from ._lib import check, fn

TYPES = ["default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"]
_D = ctypes.c_double
_DP = ctypes.POINTER(ctypes.c_double)


class RopeConfig(ctypes.Structure):
    """Mirror of hr_rope_config (include/hubrt/ops.h)."""

    _fields_ = [("type", ctypes.c_int), ("theta", _D), ("rotary_dim", ctypes.c_int64), ("factor", _D),
                ("max_position_embeddings", ctypes.c_int64),
                ("original_max_position_embeddings", ctypes.c_int64),
                ("low_freq_factor", _D), ("high_freq_factor", _D), ("beta_fast", _D), ("beta_slow", _D),
                ("mscale", _D), ("mscale_all_dim", _D), ("attention_factor", _D), ("no_truncate", ctypes.c_bool),
                ("short_factor", _DP), ("long_factor", _DP), ("rotated_dim", ctypes.c_int64)]


_inv_freq = fn("hr_rope_inv_freq", [ctypes.POINTER(RopeConfig), ctypes.c_int64,
                                    ctypes.POINTER(ctypes.c_float), ctypes.POINTER(_D)])
_parse = fn("hr_rope_type_parse", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_bool)])


def inv_freq(rope_parameters, head_dim, max_position_embeddings, seq_len=None):
    """(inv_freq float32 [rotary_dim/2], attention_scaling) for a sequence of
    seq_len tokens (default max_position_embeddings; only dynamic and
    longrope depend on it). Unset numbers are passed as 0, which the C side
    reads as transformers' defaults."""
    rp = dict(rope_parameters or {})
    name = rp.get("rope_type", rp.get("type", "default"))
    ok = ctypes.c_bool()
    kind = _parse(name.encode(), ctypes.byref(ok))
    if not ok.value:
        raise ValueError(f"unknown rope_type {name!r}; hubrt knows {TYPES}")
    partial = rp.get("partial_rotary_factor", 1.0)
    # proportional rope spans the head, the first int(partial * head_dim // 2) pairs turning
    rotary_dim = head_dim if name == "proportional" else int(head_dim * partial)
    rotated_dim = 2 * int(partial * head_dim // 2) if name == "proportional" else 0
    c = RopeConfig(type=kind, theta=float(rp.get("rope_theta", 10000.0)), rotary_dim=rotary_dim,
                   rotated_dim=rotated_dim,
                   max_position_embeddings=max_position_embeddings,
                   original_max_position_embeddings=int(rp.get("original_max_position_embeddings")
                                                        or max_position_embeddings),
                   no_truncate=not bool(rp.get("truncate", True)))
    for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale",
                "mscale_all_dim", "attention_factor"):
        setattr(c, key, float(rp.get(key) or 0.0))
    keep = []
    for key in ("short_factor", "long_factor"):
        if rp.get(key) is not None:
            arr = (_D * len(rp[key]))(*rp[key])
            keep.append(arr)
            setattr(c, key, arr)
    out = np.zeros(rotary_dim // 2, dtype=np.float32)
    scaling = _D()
    check(_inv_freq(ctypes.byref(c), max_position_embeddings if seq_len is None else seq_len,
                    out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.byref(scaling)))
    del keep
    return out, scaling.value
