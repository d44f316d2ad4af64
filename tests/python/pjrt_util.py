"""PJRT executable-cache counters (hr_pjrt_cache_stats_get), shared by the
PJRT tests."""
import ctypes

from hubrt._lib import fn


class PjrtStats(ctypes.Structure):
    """hr_pjrt_cache_stats (src/backends/pjrt/pjrt.h)."""
    _fields_ = [("requests", ctypes.c_int64), ("hits", ctypes.c_int64), ("misses", ctypes.c_int64),
                ("compile_seconds", ctypes.c_double), ("disk_hits", ctypes.c_int64),
                ("graph_misses", ctypes.c_int64), ("graph_runs", ctypes.c_int64), ("in_place", ctypes.c_int64)]


_get = fn("hr_pjrt_cache_stats_get", [ctypes.c_char_p, ctypes.POINTER(PjrtStats)])


def pjrt_stats(backend="xla_cpu"):
    """The backend's counters as a dict."""
    s = PjrtStats()
    assert _get(backend.encode(), ctypes.byref(s)) == 0
    return {name: getattr(s, name) for name, _ in PjrtStats._fields_}


def pjrt_delta(before, after):
    return {k: after[k] - before[k] for k in before}
