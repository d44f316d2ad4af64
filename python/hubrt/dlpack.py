"""DLPack exchange with torch (and any other DLPack framework), zero-copy.

The structs follow dlpack.h (DLPACK_VERSION 60, the unversioned
DLManagedTensor in a capsule named "dltensor"), declared with ctypes.

Export (`Tensor.__dlpack__`): each exported tensor gets a DLManagedTensor
whose shape/strides arrays and hubrt tensor are kept in `_exported` until
the consumer calls the deleter (or the capsule dies unconsumed).

Import (`from_dlpack`): the producer's buffer is wrapped with
hr_tensor_wrap_host; when the last hubrt tensor over it is freed, the C
release callback calls the producer's deleter."""
import ctypes

from ._lib import HubrtError, check, fn
from .tensor import DTYPES, Tensor

_P = ctypes.c_void_p

kDLCPU = 1
_KDL_BOOL = 6  # kDLBool: dlpack >= 0.8; torch uses it for torch.bool


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", _P), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, _P)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", _P), ("deleter", _Deleter)]

# hubrt dtype -> (DLDataTypeCode, bits)
_TO_DL = {"f32": (2, 32), "bf16": (4, 16), "f16": (2, 16), "i64": (0, 64), "i32": (0, 32),
          "u8": (1, 8), "bool": (_KDL_BOOL, 8), "f64": (2, 64), "i8": (0, 8), "i16": (0, 16)}
_FROM_DL = {v: k for k, v in _TO_DL.items()}

_capi = ctypes.pythonapi
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [_P, ctypes.c_char_p, _P]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = _P
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The capsule destructor runs while the capsule is being freed: it must take
# a raw pointer (no new reference), so these two see it as void*.
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, _P, ctypes.c_char_p)(("PyCapsule_IsValid", _capi))
_get_pointer_raw = ctypes.PYFUNCTYPE(_P, _P, ctypes.c_char_p)(("PyCapsule_GetPointer", _capi))

# Capsule names must outlive the capsules: module-level constants.
_NAME = b"dltensor"
_USED = b"used_dltensor"

_wrap = fn("hr_tensor_wrap_host", [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                   ctypes.POINTER(ctypes.c_int64), _P, ctypes.c_size_t, _P, _P,
                                   ctypes.POINTER(_P)])
_data = fn("hr_tensor_data", [_P], _P)

# ---- export -------------------------------------------------------------

_exported = {}  # address of a DLManagedTensor -> what it keeps alive


@_Deleter
def _export_deleter(addr):
    _exported.pop(addr, None)


@ctypes.CFUNCTYPE(None, _P)
def _capsule_destructor(capsule):
    # An unconsumed capsule still owns its tensor; a consumed one was renamed.
    if _is_valid_raw(capsule, _NAME):
        addr = _get_pointer_raw(capsule, _NAME)
        if addr:
            _exported.pop(addr, None)


def _to_dlpack(t):
    if not t.device.startswith("cpu"):
        raise BufferError(f"__dlpack__: tensor on {t.device}; only host tensors export")
    code, bits = _TO_DL[t.dtype]
    nd = t.ndim
    shape = (ctypes.c_int64 * max(nd, 1))(*t.shape)
    strides = (ctypes.c_int64 * max(nd, 1))(*t.strides)
    m = DLManagedTensor()
    m.dl_tensor.data = _data(t.handle)
    m.dl_tensor.device = DLDevice(kDLCPU, 0)
    m.dl_tensor.ndim = nd
    m.dl_tensor.dtype = DLDataType(code, bits, 1)
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = strides
    m.dl_tensor.byte_offset = 0
    m.deleter = _export_deleter
    addr = ctypes.addressof(m)
    _exported[addr] = (m, shape, strides, t)
    return _capi.PyCapsule_New(addr, _NAME, ctypes.cast(_capsule_destructor, _P))


def _dlpack(self, *, stream=None, max_version=None, dl_device=None, copy=None):
    """A "dltensor" capsule over this tensor's memory (a copy when copy=True).
    max_version is accepted and answered with the unversioned struct, which
    the DLPack protocol allows."""
    if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
        raise BufferError(f"__dlpack__: cannot export to device {tuple(dl_device)}")
    t = self
    if copy:
        from . import ops
        t = ops.copy(self)
    return _to_dlpack(t)


def _dlpack_device(self):
    return (kDLCPU, 0)


# Tensor lives in tensor.py; the protocol methods are attached here so the
# DLPack code stays in one file.
Tensor.__dlpack__ = _dlpack
Tensor.__dlpack_device__ = _dlpack_device

# ---- import -------------------------------------------------------------


@ctypes.CFUNCTYPE(None, _P)
def _import_release(addr):
    m = DLManagedTensor.from_address(addr)
    if m.deleter:
        m.deleter(addr)


_empty = (ctypes.c_uint8 * 64)()  # data for empty tensors whose producer gives NULL


def from_dlpack(obj):
    """A zero-copy hubrt.Tensor over a DLPack producer's host memory (a torch
    tensor, any object with __dlpack__, or a "dltensor" capsule)."""
    if hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__dlpack_device__"):
            dev = tuple(obj.__dlpack_device__())
            if dev[0] != kDLCPU:
                raise HubrtError(f"from_dlpack: device {dev} is not the host; copy it to CPU first",
                                 "unsupported")
        capsule = obj.__dlpack__()
    else:
        capsule = obj
    if not _capi.PyCapsule_IsValid(capsule, _NAME):
        raise HubrtError("from_dlpack: expected an unconsumed 'dltensor' capsule", "invalid argument")
    addr = _capi.PyCapsule_GetPointer(capsule, _NAME)
    dl = DLManagedTensor.from_address(addr).dl_tensor
    key = (dl.dtype.code, dl.dtype.bits)
    if dl.device.device_type != kDLCPU:
        raise HubrtError(f"from_dlpack: device type {dl.device.device_type} is not the host",
                         "unsupported")
    if dl.dtype.lanes != 1 or key not in _FROM_DL:
        raise HubrtError(f"from_dlpack: unsupported DLPack dtype code {key[0]} bits {key[1]} "
                         f"lanes {dl.dtype.lanes}", "dtype error")
    dtype = _FROM_DL[key]
    nd = dl.ndim
    shape = [dl.shape[i] for i in range(nd)]
    if dl.strides:
        strides = [dl.strides[i] for i in range(nd)]
    else:
        strides, s = [0] * nd, 1
        for i in reversed(range(nd)):
            strides[i], s = s, s * max(shape[i], 1)
    if any(st < 0 for st in strides):
        raise HubrtError("from_dlpack: negative strides are not supported (flip a copy)",
                         "unsupported")
    item = dl.dtype.bits // 8
    numel = 1
    for v in shape:
        numel *= v
    span = 0 if numel == 0 else (sum((n - 1) * st for n, st in zip(shape, strides)) + 1) * item
    data = (dl.data or 0) + dl.byte_offset
    if numel == 0 and not data:
        data = ctypes.addressof(_empty)
    out = _P()
    cshape = (ctypes.c_int64 * max(nd, 1))(*shape)
    cstrides = (ctypes.c_int64 * max(nd, 1))(*strides)
    check(_wrap(DTYPES.index(dtype), nd, cshape, cstrides, data, span,
                ctypes.cast(_import_release, _P), addr, ctypes.byref(out)))
    # From here the hubrt buffer owns the producer's tensor.
    _capi.PyCapsule_SetName(capsule, _USED)
    return Tensor(out)
