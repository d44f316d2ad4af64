"""Compile-cache statistics of this process (hr_compile_stats_get)."""
import ctypes

from ._lib import fn


class _Stats(ctypes.Structure):
    _fields_ = [("requests", ctypes.c_int64), ("hits", ctypes.c_int64), ("disk_hits", ctypes.c_int64),
                ("compiles", ctypes.c_int64), ("disk_rejects", ctypes.c_int64),
                ("compile_ms", ctypes.c_double)]


_get = fn("hr_compile_stats_get", [ctypes.POINTER(_Stats)], None)
_reset = fn("hr_compile_stats_reset", [], None)


def compile_stats():
    """requests, hits (plans in memory), disk_hits, compiles (plans built in
    this process), disk_rejects (corrupt or stale entries) and compile_ms."""
    s = _Stats()
    _get(ctypes.byref(s))
    return {name: getattr(s, name) for name, _ in _Stats._fields_}


def reset_compile_stats():
    _reset()
