"""hubrt: run Hugging Face models natively, in C. Python front end."""
from ._lib import HubrtError, lib
from .tensor import Tensor, tensor, from_numpy
from . import ops

__version__ = lib.hr_version().decode()

__all__ = ["HubrtError", "Tensor", "tensor", "from_numpy", "ops", "__version__"]
