"""GPU and interconnect specs: the catalog every timing and memory model reads."""

from gpemu.hardware.spec import GPUSpec, get_gpu, gpu_names, list_gpus

__all__ = ["GPUSpec", "get_gpu", "gpu_names", "list_gpus"]
