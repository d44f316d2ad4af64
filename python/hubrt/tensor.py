"""hubrt.Tensor: a handle on a C hr_tensor, with numpy round trips."""
import ctypes

import numpy as np

from ._lib import check, fn

_P = ctypes.c_void_p
_I64P = ctypes.POINTER(ctypes.c_int64)

# hr_dtype enum order (include/hubrt/base.h); bf16 has no numpy type and is
# carried as raw uint16 bits.
DTYPES = ["f32", "bf16", "f16", "i64", "i32", "u8", "bool", "f64", "i8", "i16",
          # block-quantized (HR_QTYPE_LIST): numpy(raw=True) gives their bytes
          "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
          "mxfp4", "fp8",
          # added after the block types: the Hub's FP8 weights, as stored
          "f8_e4m3"]
QUANTIZED = set(DTYPES[DTYPES.index("q8_0"):DTYPES.index("fp8") + 1])
_NP = {"f32": np.float32, "bf16": np.uint16, "f16": np.float16, "i64": np.int64,
       "i32": np.int32, "u8": np.uint8, "bool": np.bool_, "f64": np.float64,
       "i8": np.int8, "i16": np.int16, "f8_e4m3": np.uint8}


def _e4m3_values():
    """float8_e4m3fn's 256 codes as float32: 4 exponent bits biased by 7, 3
    mantissa bits, subnormals at exponent 0, NaN at 0x7f / 0xff."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, (b & 7) / 8.0
    v = np.where(e == 0, m * 2.0 ** -6, (1 + m) * 2.0 ** (e - 7.0))
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return np.where(b & 0x80, -v, v).astype(np.float32)


_E4M3 = _e4m3_values()
_FROM_NP = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
            np.dtype(np.int64): "i64", np.dtype(np.int32): "i32", np.dtype(np.uint8): "u8",
            np.dtype(np.bool_): "bool", np.dtype(np.float64): "f64", np.dtype(np.int8): "i8",
            np.dtype(np.int16): "i16"}
_ALIASES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64",
            "int32": "i32", "uint8": "u8", "float64": "f64", "int8": "i8", "int16": "i16",
            "float": "f32", "half": "f16", "long": "i64", "int": "i32", "double": "f64"}

_from_host = fn("hr_tensor_from_host", [_P, ctypes.c_int, ctypes.c_int, _I64P, _P, ctypes.c_size_t,
                                        ctypes.POINTER(_P)])
_free = fn("hr_tensor_free", [_P], None)
_dtype = fn("hr_tensor_dtype", [_P])
_ndim = fn("hr_tensor_ndim", [_P])
_shape = fn("hr_tensor_shape", [_P], _I64P)
_strides = fn("hr_tensor_strides", [_P], _I64P)
_read = fn("hr_tensor_read", [_P, _P, ctypes.c_size_t])
_nbytes = fn("hr_tensor_nbytes", [_P], ctypes.c_size_t)
_name = fn("hr_tensor_name", [_P], ctypes.c_char_p)
_contig = fn("hr_tensor_is_contiguous", [_P], ctypes.c_bool)
_dev_get = fn("hr_device_get", [ctypes.c_char_p, ctypes.POINTER(_P)])
_dev_name = fn("hr_device_name", [_P], ctypes.c_char_p)
_dev_index = fn("hr_device_index", [_P])
_tdevice = fn("hr_tensor_device", [_P], _P)
_to = fn("hr_tensor_to", [_P, _P, ctypes.POINTER(_P)])
_quantize = fn("hr_tensor_quantize", [_P, ctypes.c_int, ctypes.POINTER(_P)])
_view = fn("hr_tensor_view", [_P, ctypes.c_int, _I64P, ctypes.POINTER(_P)])
_reshape = fn("hr_tensor_reshape", [_P, ctypes.c_int, _I64P, ctypes.POINTER(_P)])
_slice = fn("hr_tensor_slice", [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                ctypes.POINTER(_P)])
_narrow = fn("hr_tensor_narrow", [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(_P)])
_select = fn("hr_tensor_select", [_P, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(_P)])
_permute = fn("hr_tensor_permute", [_P, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_P)])
_transpose = fn("hr_tensor_transpose", [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_P)])
_expand = fn("hr_tensor_expand", [_P, ctypes.c_int, _I64P, ctypes.POINTER(_P)])
_unsqueeze = fn("hr_tensor_unsqueeze", [_P, ctypes.c_int, ctypes.POINTER(_P)])
_squeeze = fn("hr_tensor_squeeze", [_P, ctypes.c_int, ctypes.POINTER(_P)])


def dtype_name(dtype):
    """Normalises 'bfloat16', 'torch.bfloat16', numpy dtypes ... to 'bf16'."""
    if isinstance(dtype, str):
        d = dtype.replace("torch.", "")
        d = _ALIASES.get(d, d)
        if d in DTYPES:
            return d
        raise ValueError(f"unknown dtype {dtype!r}")
    return _FROM_NP[np.dtype(dtype)]


def device_handle(spec="cpu"):
    """The C device handle for 'cpu', 'cpu:0', ..."""
    h = _P()
    check(_dev_get(spec.encode(), ctypes.byref(h)))
    return h


def _ints(values):
    values = [int(v) for v in values]
    return len(values), (ctypes.c_int64 * max(len(values), 1))(*values)


class Tensor:
    """Owns one hr_tensor handle; freed with the Python object."""

    __slots__ = ("_h",)

    def __init__(self, handle):
        self._h = ctypes.c_void_p(handle) if not isinstance(handle, ctypes.c_void_p) else handle

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            _free(self._h)
            self._h = ctypes.c_void_p()

    @property
    def handle(self):
        return self._h

    @property
    def dtype(self):
        return DTYPES[_dtype(self._h)]

    @property
    def ndim(self):
        return _ndim(self._h)

    @property
    def shape(self):
        p = _shape(self._h)
        return tuple(p[i] for i in range(self.ndim))

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def strides(self):
        p = _strides(self._h)
        return tuple(p[i] for i in range(self.ndim))

    @property
    def name(self):
        return _name(self._h).decode()

    @property
    def device(self):
        d = _tdevice(self._h)
        name = _dev_name(d).decode()
        return f"{name}:{_dev_index(d)}"

    def is_contiguous(self):
        return bool(_contig(self._h))

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        return f"hubrt.Tensor(shape={list(self.shape)}, dtype={self.dtype}, device={self.device})"

    def numpy(self, raw=False):
        """A numpy copy. bf16 and f8_e4m3 come back as float32 unless raw=True
        (uint16 bits, uint8 codes);
        a block-quantized tensor only raw, as uint8 [..., bytes per row]."""
        if self.dtype in QUANTIZED:
            if not raw:
                raise TypeError(f"a {self.dtype} tensor has no numpy dtype: numpy(raw=True) gives its blocks")
            shape = list(self.shape)
            arr = np.empty(shape[:-1] + [_nbytes(self._h) // max(1, int(np.prod(shape[:-1])))], dtype=np.uint8)
            check(_read(self._h, arr.ctypes.data_as(ctypes.c_void_p), arr.nbytes))
            return arr
        arr = np.empty(self.shape, dtype=_NP[self.dtype])
        check(_read(self._h, arr.ctypes.data_as(ctypes.c_void_p), arr.nbytes))
        if self.dtype == "f8_e4m3" and not raw:
            return _E4M3[arr]
        if self.dtype == "bf16" and not raw:
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def tolist(self):
        return self.numpy().tolist()

    def item(self):
        return self.numpy().item()

    def quantize(self, dtype):
        """A CPU copy in block type dtype ("q8_0", "q4_0", "q4_1", "q5_0",
        "q5_1"), quantized row by row as ggml's reference quantizer does."""
        if dtype not in QUANTIZED:
            raise ValueError(f"{dtype!r} is not a block type ({', '.join(sorted(QUANTIZED))})")
        out = _P()
        check(_quantize(self._h, DTYPES.index(dtype), ctypes.byref(out)))
        return Tensor(out)

    def to(self, dev=None, dtype=None):
        """Copy to a device ('cpu', ...) and/or cast to a dtype."""
        t = self
        if dev is not None:
            out = _P()
            check(_to(t._h, device_handle(dev) if isinstance(dev, str) else dev, ctypes.byref(out)))
            t = Tensor(out)
        if dtype is not None and dtype_name(dtype) != t.dtype:
            from . import ops
            t = ops.cast(t, dtype)
        return t

    # -- views (no copy) --------------------------------------------------
    def _view_call(self, f, *args):
        out = _P()
        check(f(self._h, *args, ctypes.byref(out)))
        return Tensor(out)

    def view(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        n, arr = _ints(shape)
        return self._view_call(_view, n, arr)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        n, arr = _ints(shape)
        return self._view_call(_reshape, n, arr)

    def slice(self, dim, start=0, end=None, step=1):
        end = 2**62 if end is None else end
        return self._view_call(_slice, dim, start, end, step)

    def narrow(self, dim, start, length):
        return self._view_call(_narrow, dim, start, length)

    def select(self, dim, index):
        return self._view_call(_select, dim, index)

    def permute(self, *dims):
        dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        arr = (ctypes.c_int * max(len(dims), 1))(*dims)
        return self._view_call(_permute, len(dims), arr)

    def transpose(self, d0, d1):
        return self._view_call(_transpose, d0, d1)

    def expand(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        n, arr = _ints(shape)
        return self._view_call(_expand, n, arr)

    def unsqueeze(self, dim):
        return self._view_call(_unsqueeze, dim)

    def squeeze(self, dim):
        return self._view_call(_squeeze, dim)

    def contiguous(self):
        from . import ops
        return ops.contiguous(self)


def from_blocks(data, dtype, shape, device="cpu"):
    """A block-quantized tensor (q8_0, ..., fp8) of logical `shape` from its
    raw bytes (a uint8 array or bytes, rows of whole blocks): the inverse
    of numpy(raw=True)."""
    d = dtype_name(dtype)
    if d not in QUANTIZED:
        raise ValueError(f"from_blocks takes a block-quantized dtype, not {dtype!r}")
    raw = np.require(np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray))
                     else np.asarray(data, np.uint8), requirements="C")
    n, dims = _ints(shape)
    out = _P()
    dev = device_handle(device) if isinstance(device, str) else device
    check(_from_host(dev, DTYPES.index(d), n, dims, raw.ctypes.data_as(ctypes.c_void_p), raw.nbytes,
                     ctypes.byref(out)))
    return Tensor(out)


def from_numpy(arr, dtype=None, device="cpu"):
    """A copy of `arr` as a hubrt tensor. dtype='bf16' converts floats to
    bfloat16; a uint16 array with dtype='bf16' is taken as raw bf16 bits."""
    arr = np.asarray(arr)
    target = dtype_name(dtype) if dtype is not None else None
    # np.ascontiguousarray would turn a 0-d array into shape (1,).
    contiguous = lambda a, dt=None: np.require(a if dt is None else a.astype(dt, copy=False), requirements="C")
    if target == "bf16" and arr.dtype == np.uint16:
        src, st = contiguous(arr), "bf16"
    elif target == "bf16":
        f = contiguous(arr, np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        nan = np.isnan(f)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        src, st = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded), "bf16"
    else:
        if target is not None:
            arr = arr.astype(_NP[target])
        if arr.dtype not in _FROM_NP:
            arr = arr.astype(np.float32 if arr.dtype.kind == "f" else np.int64)
        src, st = contiguous(arr), _FROM_NP[arr.dtype]
    n, shape = _ints(src.shape)
    out = _P()
    dev = device_handle(device) if isinstance(device, str) else device
    check(_from_host(dev, DTYPES.index(st), n, shape, src.ctypes.data_as(ctypes.c_void_p),
                     src.nbytes, ctypes.byref(out)))
    return Tensor(out)


def tensor(data, dtype=None, device="cpu"):
    """Like torch.tensor: from nested lists, scalars or arrays."""
    return from_numpy(np.asarray(data), dtype=dtype, device=device)
