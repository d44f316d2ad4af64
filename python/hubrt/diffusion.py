"""Image pipeline models, read from diffusers folders as they are.

    vae = hubrt.AutoencoderKL.from_pretrained("sd3/vae", dtype="float32")
    image = vae.decode(latents / vae.scaling_factor + vae.shift_factor)

Names and call shapes follow diffusers; tensors are hubrt Tensors (or
anything hubrt.tensor takes)."""
import ctypes
import os

from ._lib import check, fn
from .tensor import Tensor, tensor

_P = ctypes.c_void_p


class _ComponentOptions(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_char_p), ("device", ctypes.c_char_p), ("variant", ctypes.c_char_p)]


def _options(dtype, device, variant):
    enc = lambda s: None if s is None else str(s).encode()  # noqa: E731
    return _ComponentOptions(enc(dtype), enc(device), enc(variant))


_vae_load = fn("hr_vae_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_vae_free = fn("hr_vae_free", [_P], None)
_vae_decode = fn("hr_vae_decode", [_P, _P, ctypes.POINTER(_P)])
_vae_latent = fn("hr_vae_latent_channels", [_P], ctypes.c_int64)
_vae_upscale = fn("hr_vae_upscale", [_P], ctypes.c_int64)
_vae_scaling = fn("hr_vae_scaling_factor", [_P], ctypes.c_double)
_vae_shift = fn("hr_vae_shift_factor", [_P], ctypes.c_double)


class AutoencoderKL:
    """diffusers' AutoencoderKL: the decoder (decode(z) -> image)."""

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def from_pretrained(cls, path, subfolder=None, dtype="auto", device="cpu", variant=None, torch_dtype=None):
        path = os.fspath(path)
        if subfolder:
            path = os.path.join(path, subfolder)
        if torch_dtype is not None:
            dtype = str(torch_dtype).replace("torch.", "")
        h = _P()
        opts = _options(dtype, device, variant)
        check(_vae_load(path.encode(), ctypes.byref(opts), ctypes.byref(h)))
        return cls(h)

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            _vae_free(self._h)
            self._h = _P()

    @property
    def latent_channels(self):
        return _vae_latent(self._h)

    @property
    def vae_scale_factor(self):
        return _vae_upscale(self._h)

    @property
    def scaling_factor(self):
        return _vae_scaling(self._h)

    @property
    def shift_factor(self):
        return _vae_shift(self._h)

    def decode(self, z):
        z = z if isinstance(z, Tensor) else tensor(z)
        out = _P()
        check(_vae_decode(self._h, z.handle, ctypes.byref(out)))
        return Tensor(out)
