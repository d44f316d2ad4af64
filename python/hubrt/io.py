"""safetensors checkpoints: load (zero-copy views of the file's map) and save.

`load_safetensors` takes a .safetensors file, a model.safetensors.index.json
or a model folder, as `hubrt inspect` does; the tensors stay valid after the
files are closed. `save_safetensors` writes the layout of the `safetensors`
package, atomically."""
import ctypes
import os

import numpy as np

from ._lib import check, fn
from .tensor import DTYPES, QUANTIZED, Tensor, from_numpy

_P = ctypes.c_void_p


class _KV(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_ck_open = fn("hr_checkpoint_open", [ctypes.c_char_p, ctypes.POINTER(_P)])
_ck_close = fn("hr_checkpoint_close", [_P], None)
_ck_count = fn("hr_checkpoint_count", [_P], ctypes.c_size_t)
_ck_name = fn("hr_checkpoint_name", [_P, ctypes.c_size_t], ctypes.c_char_p)
_ck_tensor = fn("hr_checkpoint_tensor", [_P, ctypes.c_char_p, ctypes.POINTER(_P)])
_ck_tensor_as = fn("hr_checkpoint_tensor_as", [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(_P)])
_ck_stored = fn("hr_checkpoint_stored_dtype", [_P, ctypes.c_char_p], ctypes.c_int)
_ck_shard = fn("hr_checkpoint_shard", [_P, ctypes.c_size_t], _P)
_meta_count = fn("hr_safetensors_metadata_count", [_P], ctypes.c_size_t)
_meta_at = fn("hr_safetensors_metadata_at", [_P, ctypes.c_size_t], _KV)
_write = fn("hr_safetensors_write", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(_P), ctypes.c_size_t, ctypes.POINTER(_KV),
                                     ctypes.c_size_t])


class _Checkpoint:
    """An open hr_checkpoint, closed on exit (its tensors live on)."""

    def __init__(self, path):
        self.h = _P()
        check(_ck_open(os.fsencode(path), ctypes.byref(self.h)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _ck_close(self.h)

    def names(self):
        return [_ck_name(self.h, i) for i in range(_ck_count(self.h))]


def load_safetensors(path, quantized=False):
    """{name: hubrt.Tensor} for a file, an index or a model folder, sorted by
    name. Each tensor is a zero-copy view of the memory-mapped file; writing
    to one changes this process's copy only. A GGUF file's block-quantized
    tensors come dequantized to float32, or with quantized=True in their
    blocks (dtype "q4_1", ...), as a model on the CPU keeps them."""
    out = {}
    with _Checkpoint(path) as ck:
        for name in ck.names():
            h = _P()
            stored = _ck_stored(ck.h, name)
            if quantized and 0 <= stored < len(DTYPES) and DTYPES[stored] in QUANTIZED:
                check(_ck_tensor_as(ck.h, name, stored, ctypes.byref(h)))
            else:
                check(_ck_tensor(ck.h, name, ctypes.byref(h)))
            out[name.decode("utf-8")] = Tensor(h)
    return out


def safetensors_metadata(path):
    """The `__metadata__` of a file (of the first shard for a folder)."""
    with _Checkpoint(path) as ck:
        st = _ck_shard(ck.h, 0)  # NULL for an index with an empty weight_map
        kvs = [_meta_at(st, i) for i in range(_meta_count(st))] if st else []
        return {kv.key.decode("utf-8"): kv.value.decode("utf-8") for kv in kvs}


def _as_tensor(value):
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        from .dlpack import from_dlpack
        return from_dlpack(value)
    return from_numpy(np.asarray(value))


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} to `path` (hubrt tensors, torch tensors through
    DLPack, or anything numpy takes), then renames it into place."""
    if not all(isinstance(k, str) for k in tensors):
        raise TypeError("save_safetensors: tensor names must be str")
    meta = list((metadata or {}).items())
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta):
        raise TypeError("save_safetensors: metadata must map str to str")
    items = [(k, _as_tensor(v)) for k, v in tensors.items()]
    names = (ctypes.c_char_p * max(len(items), 1))(*[k.encode("utf-8") for k, _ in items])
    handles = (_P * max(len(items), 1))(*[t.handle.value for _, t in items])
    kvs = (_KV * max(len(meta), 1))(*[_KV(k.encode("utf-8"), v.encode("utf-8")) for k, v in meta])
    check(_write(os.fsencode(path), names, handles, len(items), kvs, len(meta)))


_export_gguf = fn("hr_model_export_gguf", [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p])


def save_gguf(model_dir, path, type="q8_0"):
    """Write model folder `model_dir` (safetensors: Llama, Mistral, Qwen2,
    Qwen3) as a GGUF file at `path` that llama.cpp loads: the converter's
    metadata, tensor names and tokenizer, the matrices in `type` ("f32",
    "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k", "q5_k",
    "q6_k"; quantized as ggml's reference quantizer does), norms and biases
    in f32. Streamed tensor by tensor, atomic. `hubrt quantize` is the CLI."""
    check(_export_gguf(os.fsencode(model_dir), os.fsencode(path), type.encode()))
