"""Loads libhubrt through ctypes and turns C statuses into exceptions.

The library is found at $HUBRT_LIBRARY, else in the repository's build/
folder (the package is installed editable from the repository)."""
import ctypes
import os
from pathlib import Path


class HubrtError(RuntimeError):
    """A hubrt call failed; the message is the C library's, naming the file,
    tensor or field at fault. `status` is the C status name."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def _find_library():
    env = os.environ.get("HUBRT_LIBRARY")
    if env:
        return env
    root = Path(__file__).resolve().parents[2]
    for cand in (root / "build" / "libhubrt.so",):
        if cand.exists():
            return str(cand)
    raise ImportError(
        "libhubrt.so not found: run `make` in the hubrt repository or set HUBRT_LIBRARY")


lib = ctypes.CDLL(_find_library())

lib.hr_last_error.restype = ctypes.c_char_p
lib.hr_status_name.restype = ctypes.c_char_p
lib.hr_status_name.argtypes = [ctypes.c_int]
lib.hr_version.restype = ctypes.c_char_p


def check(status):
    """Raises HubrtError carrying the C message when status is not HR_OK."""
    if status != 0:
        msg = lib.hr_last_error().decode("utf-8", "replace")
        name = lib.hr_status_name(status).decode()
        raise HubrtError(msg or name, name)


def fn(name, argtypes, restype=ctypes.c_int):
    """Declares a C function's signature once and returns it."""
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = restype
    return f
