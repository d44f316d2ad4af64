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
    _fields_ = [("dtype", ctypes.c_char_p), ("device", ctypes.c_char_p), ("variant", ctypes.c_char_p),
                ("compile", ctypes.c_bool)]


def _options(dtype, device, variant, compile=False):
    enc = lambda s: None if s is None else str(s).encode()  # noqa: E731
    return _ComponentOptions(enc(dtype), enc(device), enc(variant), bool(compile))


def _path(path, subfolder):
    path = os.fspath(path)
    return os.path.join(path, subfolder) if subfolder else path


def _dtype_name(dtype, torch_dtype):
    return str(torch_dtype).replace("torch.", "") if torch_dtype is not None else dtype


class _Component:
    """A model read from its folder by a C loader (_load) and freed by _free."""

    _load = _free = None

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def from_pretrained(cls, path, subfolder=None, dtype="auto", device="cpu", variant=None, torch_dtype=None,
                        compile=False):
        h = _P()
        opts = _options(_dtype_name(dtype, torch_dtype), device, variant, compile)
        check(cls._load(_path(path, subfolder).encode(), ctypes.byref(opts), ctypes.byref(h)))
        return cls(h)

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            type(self)._free(self._h)
            self._h = _P()


_vae_load = fn("hr_vae_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_vae_free = fn("hr_vae_free", [_P], None)
_vae_decode = fn("hr_vae_decode", [_P, _P, ctypes.POINTER(_P)])
_vae_encode = fn("hr_vae_encode", [_P, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)])


class DiagonalGaussianDistribution:
    """The encoder's latent distribution: .mean, .logvar, .mode()."""

    def __init__(self, mean, logvar):
        self.mean, self.logvar = mean, logvar

    def mode(self):
        return self.mean


class AutoencoderKLOutput:
    def __init__(self, latent_dist):
        self.latent_dist = latent_dist
_vae_latent = fn("hr_vae_latent_channels", [_P], ctypes.c_int64)
_vae_upscale = fn("hr_vae_upscale", [_P], ctypes.c_int64)
_vae_scaling = fn("hr_vae_scaling_factor", [_P], ctypes.c_double)
_vae_shift = fn("hr_vae_shift_factor", [_P], ctypes.c_double)


class AutoencoderKL(_Component):
    """diffusers' AutoencoderKL: the decoder (decode(z) -> image)."""

    _load, _free = staticmethod(_vae_load), staticmethod(_vae_free)

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

    def encode(self, x):
        """diffusers' encode(x): .latent_dist.mean / .logvar (pixels in [-1, 1])."""
        x = x if isinstance(x, Tensor) else tensor(x)
        mean, logvar = _P(), _P()
        check(_vae_encode(self._h, x.handle, ctypes.byref(mean), ctypes.byref(logvar)))
        return AutoencoderKLOutput(DiagonalGaussianDistribution(Tensor(mean), Tensor(logvar)))

    def decode(self, z):
        z = z if isinstance(z, Tensor) else tensor(z)
        out = _P()
        check(_vae_decode(self._h, z.handle, ctypes.byref(out)))
        return Tensor(out)


class _FlowMatchConfig(ctypes.Structure):
    _fields_ = [("num_train_timesteps", ctypes.c_int64), ("shift", ctypes.c_double),
                ("use_dynamic_shifting", ctypes.c_bool), ("base_shift", ctypes.c_double),
                ("max_shift", ctypes.c_double), ("base_image_seq_len", ctypes.c_int64),
                ("max_image_seq_len", ctypes.c_int64), ("invert_sigmas", ctypes.c_bool),
                ("shift_terminal", ctypes.c_double), ("schedule", ctypes.c_int), ("time_shift", ctypes.c_int),
                ("stochastic_sampling", ctypes.c_bool)]


_fm_defaults = fn("hr_flow_match_config_defaults", [ctypes.POINTER(_FlowMatchConfig)], None)
_fm_load = fn("hr_flow_match_config_load", [ctypes.c_char_p, ctypes.POINTER(_FlowMatchConfig)])
_fm_timesteps = fn("hr_flow_match_timesteps", [ctypes.POINTER(_FlowMatchConfig), ctypes.c_int64, ctypes.c_double,
                                               ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float),
                                               ctypes.POINTER(ctypes.c_float)])
_fm_mu = fn("hr_flow_match_mu", [ctypes.POINTER(_FlowMatchConfig), ctypes.c_int64], ctypes.c_double)
_fm_step = fn("hr_flow_match_step", [ctypes.c_float, ctypes.c_float, _P, _P, ctypes.POINTER(_P)])

_SCHEDULES = {"use_karras_sigmas": 1, "use_exponential_sigmas": 2, "use_beta_sigmas": 3}


class FlowMatchEulerDiscreteScheduler:
    """diffusers' FlowMatchEulerDiscreteScheduler: set_timesteps fills
    .sigmas and .timesteps (NumPy f32, as diffusers' tensors hold them);
    step(model_output, timestep, sample) returns prev_sample."""

    def __init__(self, **config):
        c = _FlowMatchConfig()
        _fm_defaults(ctypes.byref(c))
        for key, value in config.items():
            if key in _SCHEDULES:
                if value:
                    c.schedule = _SCHEDULES[key]
            elif key == "time_shift_type":
                c.time_shift = {"exponential": 0, "linear": 1}[value]
            elif key == "shift_terminal":
                c.shift_terminal = value or 0.0
            elif any(key == f[0] for f in _FlowMatchConfig._fields_):
                setattr(c, key, value)
            else:
                raise TypeError(f"FlowMatchEulerDiscreteScheduler: unknown config field '{key}'")
        self._c = c
        self.sigmas = self.timesteps = None
        self._step_index = None

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        path = os.fspath(path)
        if subfolder:
            path = os.path.join(path, subfolder)
        if os.path.isdir(path):
            path = os.path.join(path, "scheduler_config.json")
        self = cls()
        check(_fm_load(path.encode(), ctypes.byref(self._c)))
        return self

    def calculate_mu(self, image_seq_len):
        return _fm_mu(ctypes.byref(self._c), image_seq_len)

    def set_timesteps(self, num_inference_steps=None, mu=None, sigmas=None):
        import numpy as np

        custom = None
        if sigmas is not None:
            custom = np.ascontiguousarray(np.asarray(sigmas, np.float32))
            num_inference_steps = len(custom)
        n = int(num_inference_steps)
        s = np.zeros(n + 1, np.float32)
        t = np.zeros(max(n, 1), np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        check(_fm_timesteps(ctypes.byref(self._c), n, float("nan") if mu is None else float(mu),
                            None if custom is None else custom.ctypes.data_as(fp), s.ctypes.data_as(fp),
                            t.ctypes.data_as(fp)))
        self.sigmas, self.timesteps, self._step_index = s, t[:n], None

    def step(self, model_output, timestep, sample):
        """One Euler step; the step index follows the calls, as diffusers'
        (the first call finds `timestep` in .timesteps)."""
        if self._step_index is None:
            hits = [i for i, t in enumerate(self.timesteps) if t == timestep]
            self._step_index = hits[1] if len(hits) > 1 else hits[0] if hits else 0
        i = self._step_index
        out = _P()
        check(_fm_step(float(self.sigmas[i]), float(self.sigmas[i + 1]), sample.handle, model_output.handle,
                       ctypes.byref(out)))
        self._step_index += 1
        return Tensor(out)


_sd3_load = fn("hr_sd3_transformer_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_sd3_free = fn("hr_sd3_transformer_free", [_P], None)
_sd3_forward = fn("hr_sd3_transformer_forward", [_P, _P, _P, _P, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(_P)])


class Transformer2DModelOutput:
    def __init__(self, sample):
        self.sample = sample


class SD3Transformer2DModel(_Component):
    """diffusers' SD3Transformer2DModel (SD3, SD3.5). compile=True compiles
    the forward once per input signature and replays it."""

    _load, _free = staticmethod(_sd3_load), staticmethod(_sd3_free)

    def __call__(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, return_dict=True):
        import numpy as np

        ins = [t if isinstance(t, Tensor) else tensor(t) for t in (hidden_states, encoder_hidden_states,
                                                                  pooled_projections)]
        t = np.ascontiguousarray(np.broadcast_to(np.asarray(timestep, np.float32).reshape(-1), (ins[0].shape[0],)))
        out = _P()
        check(_sd3_forward(self._h, ins[0].handle, ins[1].handle, ins[2].handle,
                           t.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.byref(out)))
        sample = Tensor(out)
        return Transformer2DModelOutput(sample) if return_dict else (sample,)

_randn = fn("hr_torch_randn_as", [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p])


def torch_randn(shape, seed, dtype="float32"):
    """torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed),
    dtype=dtype) bit for bit (float32, bfloat16 or float16; at least 16
    values), as a NumPy float32 array of those values."""
    import numpy as np

    from .tensor import _ALIASES, DTYPES

    name = _ALIASES.get(dtype, dtype)
    out = np.empty(shape, np.float32 if name == "f32" else np.uint16)
    check(_randn(seed & 0xFFFFFFFFFFFFFFFF, out.size, DTYPES.index(name), out.ctypes.data))
    if name == "bf16":
        return (out.astype(np.uint32) << 16).view(np.float32)
    return out.view(np.float16).astype(np.float32) if name == "f16" else out


class _SD3Call(ctypes.Structure):
    _fields_ = [("prompt", ctypes.c_char_p), ("prompt_2", ctypes.c_char_p), ("prompt_3", ctypes.c_char_p),
                ("negative_prompt", ctypes.c_char_p), ("negative_prompt_2", ctypes.c_char_p),
                ("negative_prompt_3", ctypes.c_char_p), ("max_sequence_length", ctypes.c_int64),
                ("skip_t5", ctypes.c_bool), ("num_images_per_prompt", ctypes.c_int64), ("prompt_embeds", _P), ("pooled_prompt_embeds", _P), ("negative_prompt_embeds", _P),
                ("negative_pooled_prompt_embeds", _P), ("steps", ctypes.c_int64), ("guidance_scale", ctypes.c_double),
                ("height", ctypes.c_int64), ("width", ctypes.c_int64), ("seed", ctypes.c_uint64), ("latents", _P),
                ("sigmas", ctypes.POINTER(ctypes.c_float)), ("mu", ctypes.c_double), ("output_latents", ctypes.c_bool),
                ("progress", ctypes.CFUNCTYPE(None, _P, ctypes.c_int64, ctypes.c_int64)), ("progress_ctx", _P)]


_pipe_load = fn("hr_sd3_pipeline_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_pipe_free = fn("hr_sd3_pipeline_free", [_P], None)
_pipe_run = fn("hr_sd3_pipeline_run", [_P, ctypes.POINTER(_SD3Call), ctypes.POINTER(_P)])


class StableDiffusion3PipelineOutput:
    def __init__(self, images):
        self.images = images


def _seed_of(generator, seed):
    """A seed, or a freshly seeded torch.Generator("cpu") (its initial seed:
    hubrt draws the stream torch draws from a generator not yet used)."""
    if seed is not None:
        return int(seed)
    if generator is None:
        return 0
    if isinstance(generator, (list, tuple)):
        raise ValueError("a list of generators is not supported; pass one generator or seed=")
    return int(generator.initial_seed())


class StableDiffusion3Pipeline(_Component):
    """diffusers' StableDiffusion3Pipeline on hubrt: a prompt (or prompt
    embeddings, as diffusers' call takes them), the CLIP and T5 encoders
    loaded for the call and freed before denoising, the transformer
    compiled once per batch and resolution unless compile=False."""

    _load, _free = staticmethod(_pipe_load), staticmethod(_pipe_free)

    @classmethod
    def from_pretrained(cls, path, dtype="auto", device="cpu", variant=None, torch_dtype=None, compile=True):
        return super().from_pretrained(path, None, dtype, device, variant, torch_dtype, compile)

    def __call__(self, prompt=None, prompt_2=None, prompt_3=None, *, negative_prompt=None, negative_prompt_2=None,
                 negative_prompt_3=None, prompt_embeds=None, pooled_prompt_embeds=None, negative_prompt_embeds=None,
                 negative_pooled_prompt_embeds=None, num_inference_steps=28, guidance_scale=7.0, height=None,
                 width=None, num_images_per_prompt=1, generator=None, seed=None, latents=None, sigmas=None, mu=None,
                 max_sequence_length=256, skip_t5=False, output_type="pil", callback=None):
        import numpy as np

        texts = [prompt, prompt_2, prompt_3, negative_prompt, negative_prompt_2, negative_prompt_3]
        for t in texts:
            if t is not None and not isinstance(t, str):
                raise TypeError("hubrt's pipeline takes one prompt (a str) per call; use num_images_per_prompt")
        texts = [None if t is None else t.encode() for t in texts]
        as_t = lambda t: None if t is None else (t if isinstance(t, Tensor) else tensor(t))  # noqa: E731
        keep = [as_t(t) for t in (prompt_embeds, pooled_prompt_embeds, negative_prompt_embeds,
                                  negative_pooled_prompt_embeds, latents)]
        handle = lambda t: None if t is None else t.handle.value  # noqa: E731
        sig = None if sigmas is None else np.ascontiguousarray(np.asarray(sigmas, np.float32))
        if sig is not None:
            num_inference_steps = len(sig)
        progress_t = _SD3Call._fields_[-2][1]
        cb = progress_t(lambda ctx, i, n: callback(int(i), int(n))) if callback else progress_t()
        call = _SD3Call(*texts, int(max_sequence_length), bool(skip_t5), int(num_images_per_prompt),
                        *[handle(t) for t in keep[:4]], int(num_inference_steps), float(guidance_scale),
                        int(height or 0), int(width or 0), _seed_of(generator, seed) & 0xFFFFFFFFFFFFFFFF,
                        handle(keep[4]), None if sig is None else sig.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                        float("nan") if mu is None else float(mu), output_type == "latent", cb, None)
        out = _P()
        check(_pipe_run(self._h, ctypes.byref(call), ctypes.byref(out)))
        images = Tensor(out)
        if output_type in ("latent", "hubrt"):
            return StableDiffusion3PipelineOutput(images)
        arr = images.numpy().transpose(0, 2, 3, 1)  # as diffusers' "np": [b, h, w, c]
        if output_type == "np":
            return StableDiffusion3PipelineOutput(arr)
        from PIL import Image

        return StableDiffusion3PipelineOutput([Image.fromarray((a * 255).round().astype("uint8")) for a in arr])


class DiffusionPipeline:
    """Loads the pipeline model_index.json names (StableDiffusion3Pipeline)."""

    @staticmethod
    def from_pretrained(path, **kwargs):
        import json

        index = os.path.join(os.fspath(path), "model_index.json")
        with open(index) as f:
            name = json.load(f).get("_class_name")
        if name != "StableDiffusion3Pipeline":
            raise ValueError(f"{index}: pipeline '{name}' is not one hubrt has (StableDiffusion3Pipeline)")
        return StableDiffusion3Pipeline.from_pretrained(path, **kwargs)


_clip_load = fn("hr_clip_text_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_clip_free = fn("hr_clip_text_free", [_P], None)
_clip_forward = fn("hr_clip_text_forward", [_P, _P, ctypes.c_int, ctypes.POINTER(_P), ctypes.POINTER(_P)])


class CLIPTextModelOutput:
    def __init__(self, text_embeds, hidden_state):
        self.text_embeds = text_embeds
        self.hidden_state = hidden_state


class CLIPTextModelWithProjection(_Component):
    """transformers' CLIPTextModelWithProjection (and CLIPTextModel): call with
    input_ids and the hidden_states index wanted (SD3 reads -2)."""

    _load, _free = staticmethod(_clip_load), staticmethod(_clip_free)

    def __call__(self, input_ids, hidden_index=-1, text_embeds=True):
        ids = input_ids if isinstance(input_ids, Tensor) else tensor(input_ids, dtype="i64")
        hid, emb = _P(), _P()
        check(_clip_forward(self._h, ids.handle, int(hidden_index), ctypes.byref(hid),
                            ctypes.byref(emb) if text_embeds else None))
        return CLIPTextModelOutput(Tensor(emb) if text_embeds else None, Tensor(hid))

_t5_load = fn("hr_t5_encoder_load", [ctypes.c_char_p, ctypes.POINTER(_ComponentOptions), ctypes.POINTER(_P)])
_t5_free = fn("hr_t5_encoder_free", [_P], None)
_t5_forward = fn("hr_t5_encoder_forward", [_P, _P, ctypes.POINTER(_P)])


class T5EncoderModel(_Component):
    """transformers' T5EncoderModel: model(input_ids) -> last_hidden_state."""

    _load, _free = staticmethod(_t5_load), staticmethod(_t5_free)

    def __call__(self, input_ids):
        ids = input_ids if isinstance(input_ids, Tensor) else tensor(input_ids, dtype="i64")
        out = _P()
        check(_t5_forward(self._h, ids.handle, ctypes.byref(out)))
        return Tensor(out)
