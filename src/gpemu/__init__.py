"""gpemu: a GPU emulator for deep-learning systems research (timing, memory and concurrency; never values)."""

from gpemu.estimate import Estimate
from gpemu.hardware import GPUSpec, get_gpu, list_gpus

__version__ = "0.1.0"

__all__ = ["Estimate", "GPUSpec", "__version__", "get_gpu", "list_gpus"]
