"""Models by Hub id: the Hugging Face cache (HF_HUB_CACHE, HF_HOME) read
and filled by the C library (include/hubrt/hub.h), as huggingface_hub
fills it. `resolve` takes the arguments transformers' from_pretrained
takes for it."""
import ctypes
import os

from ._lib import check, fn, lib


class _HubOptions(ctypes.Structure):
    _fields_ = [("revision", ctypes.c_char_p), ("cache_dir", ctypes.c_char_p), ("endpoint", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("offline", ctypes.c_int), ("progress", ctypes.c_int)]


_model_dir = fn("hr_hub_model_dir", [ctypes.c_char_p, ctypes.POINTER(_HubOptions), ctypes.POINTER(ctypes.c_void_p)])
_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [ctypes.c_void_p]

HUB_ARGS = ("revision", "cache_dir", "token", "local_files_only")


def resolve(path, revision=None, cache_dir=None, token=None, local_files_only=False):
    """The local folder of `path`: itself when it exists, else the snapshot
    of the Hub repository it names, fetched into the cache when missing
    (local_files_only or HF_HUB_OFFLINE=1: the cache alone)."""
    path = os.fspath(path)
    if isinstance(token, bool):  # transformers' token=True: the stored token, as by default
        token = None
    enc = lambda s: None if s is None else os.fspath(s).encode()  # noqa: E731
    opts = _HubOptions(revision=enc(revision), cache_dir=enc(cache_dir), endpoint=None, token=enc(token),
                       offline=1 if local_files_only else -1, progress=-1)
    out = ctypes.c_void_p()
    check(_model_dir(path.encode(), ctypes.byref(opts), ctypes.byref(out)))
    try:
        return ctypes.string_at(out.value).decode()
    finally:
        _libc_free(out)


__all__ = ["resolve", "HUB_ARGS", "lib"]
