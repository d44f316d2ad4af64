"""The kernel hub (include/hubrt/kernels.h): kernels in Hugging Face's
`kernels` repository layout, checked (digests, ABI, trusted publisher, lock
file) before anything loads, as `kernels.get_kernel` finds them.

    k = hubrt.get_kernel("hubrt/experts-grouped", version=1)
    model.set_experts_implementation(k)
"""
import ctypes
import os

from ._lib import check, fn


class _Options(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int64), ("revision", ctypes.c_char_p), ("trust_remote_code", ctypes.c_bool),
                ("lock_file", ctypes.c_char_p), ("cache_dir", ctypes.c_char_p)]


class _Info(ctypes.Structure):
    _fields_ = [("repo", ctypes.c_char * 128), ("publisher", ctypes.c_char * 64), ("revision", ctypes.c_char * 64),
                ("variant", ctypes.c_char * 96), ("name", ctypes.c_char * 64), ("version", ctypes.c_int64),
                ("library", ctypes.c_char * 1024), ("digest", ctypes.c_char * 65), ("rejected", ctypes.c_char * 1024),
                ("impl_id", ctypes.c_int64)]


_verify = fn("hr_kernel_verify", [ctypes.c_char_p, ctypes.POINTER(_Options), ctypes.POINTER(_Info)])
_load = fn("hr_kernel_load", [ctypes.c_char_p, ctypes.POINTER(_Options), ctypes.POINTER(_Info)])
_lock = fn("hr_kernel_lock", [ctypes.c_char_p, ctypes.POINTER(_Options), ctypes.c_char_p])
_loaded = fn("hr_kernels_loaded", [], ctypes.c_int)


def _enc(s):
    return None if s is None else os.fspath(s).encode()


def _options(version, revision, trust_remote_code, lock, cache_dir):
    return _Options(version=int(version or 0), revision=_enc(revision), trust_remote_code=bool(trust_remote_code),
                    lock_file=_enc(lock), cache_dir=_enc(cache_dir))


class Kernel:
    """A loaded kernel: its repository, revision, variant, library and the
    id a model's experts op names it by."""

    def __init__(self, info):
        for name, _ in _Info._fields_:
            v = getattr(info, name)
            setattr(self, name, v.decode() if isinstance(v, bytes) else v)
        self.rejected = [r for r in self.rejected.split("; ") if r]

    def __repr__(self):
        return f"Kernel({self.repo!r}, revision={self.revision!r}, variant={self.variant!r})"


def get_kernel(repo_id, version=None, revision=None, trust_remote_code=False, lock=None, cache_dir=None):
    """Finds, checks and loads a kernel: `repo_id` "org/name" from the
    Hugging Face cache (fetched when missing and online), or a folder.
    version=N takes the branch "vN". lock: a lock file it must match
    (default $HUBRT_KERNELS_LOCK). Raises HubrtError naming the cause."""
    info = _Info()
    check(_load(_enc(repo_id), ctypes.byref(_options(version, revision, trust_remote_code, lock, cache_dir)),
                ctypes.byref(info)))
    return Kernel(info)


def verify_kernel(repo_id, version=None, revision=None, trust_remote_code=False, lock=None, cache_dir=None):
    """get_kernel's checks without loading; returns what they found."""
    info = _Info()
    check(_verify(_enc(repo_id), ctypes.byref(_options(version, revision, trust_remote_code, lock, cache_dir)),
                  ctypes.byref(info)))
    return Kernel(info)


def lock_kernel(repo_id, path, version=None, revision=None, trust_remote_code=False, cache_dir=None):
    """Pins the kernel's revision, variant and digests in the lock file `path`."""
    check(_lock(_enc(repo_id), ctypes.byref(_options(version, revision, trust_remote_code, None, cache_dir)),
                _enc(path)))


def kernels_loaded():
    """How many kernels this process has loaded."""
    return _loaded()
