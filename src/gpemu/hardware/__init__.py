"""GPU and interconnect specs: the catalog every timing and memory model reads."""

from gpemu.hardware.spec import DTYPE_KEYS, GPUSpec, get_gpu, gpu_names, list_gpus

__all__ = ["DTYPE_KEYS", "GPUSpec", "get_gpu", "gpu_names", "list_gpus"]
