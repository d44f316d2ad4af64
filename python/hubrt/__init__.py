"""hubrt: run Hugging Face models natively, in C. Python front end."""
from ._lib import HubrtError, lib
from .tensor import Tensor, tensor, from_numpy, from_blocks
from . import ops
from .compile import compile_stats, reset_compile_stats
from .io import load_safetensors, save_gguf, save_safetensors, safetensors_metadata
from .dlpack import from_dlpack
from .models import AutoModelForCausalLM, HubrtModelForCausalLM, KVCache
from .tokenizer import AutoTokenizer
from .diffusion import (AutoencoderKL, CLIPTextModelWithProjection, DiffusionPipeline, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                        StableDiffusion3Pipeline, T5EncoderModel)
from .kernels import Kernel, get_kernel, kernels_loaded, lock_kernel, verify_kernel
from . import distributed
from .distributed import DistributedConfig

__version__ = lib.hr_version().decode()

__all__ = ["HubrtError", "Tensor", "tensor", "from_numpy", "from_blocks", "ops", "compile_stats", "reset_compile_stats",
           "load_safetensors", "save_gguf", "save_safetensors", "safetensors_metadata", "from_dlpack",
           "AutoModelForCausalLM", "HubrtModelForCausalLM", "AutoencoderKL", "CLIPTextModelWithProjection", "FlowMatchEulerDiscreteScheduler", "SD3Transformer2DModel", "StableDiffusion3Pipeline", "T5EncoderModel", "DiffusionPipeline", "KVCache", "AutoTokenizer", "Kernel", "get_kernel",
           "verify_kernel", "lock_kernel", "kernels_loaded", "distributed", "DistributedConfig", "__version__"]
