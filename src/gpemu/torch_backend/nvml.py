"""NVML (the `pynvml` module of nvidia-ml-py) answered from the emulated devices when a script calls it directly."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
import uuid
from dataclasses import dataclass
from typing import Any

from gpemu.torch_backend import state

# Note [Emulated NVML]: scripts call NVML themselves through `pynvml` (nvidia-ml-py), not only through torch.cuda:
# NVIDIA DeepLearningExamples' ConvNets main.py calls `pynvml.nvmlInit()` and `nvmlDeviceGetCount()` in
# gpu_affinity.set_affinity on every run (even with `--gpu-affinity none`), and monitors call
# `nvmlDeviceGetMemoryInfo`. On a host without a driver, nvmlInit raises NVMLError_LibraryNotFound and the script
# dies before training. While an emulation is installed, the module's init / shutdown / device-enumeration / memory /
# CPU-affinity / name / compute-capability calls answer from the emulated devices (the same figures torch.cuda
# reports: device count, spec name, cudaMemGetInfo's free and total, so NVML's used = total - free as on a GPU,
# where NVML counts the CUDA context too). The CPU affinity is every host CPU (one emulated socket). Every other
# `nvml*` function raises NVMLError_NotSupported, the error scripts already handle for a query a GPU cannot answer,
# instead of NVMLError_Uninitialized from a library that was never loaded. Nothing is imported when pynvml is not
# installed; gpemu does not depend on it.
_MODULE = "pynvml"


@dataclass(frozen=True)
class _Handle:
    """An emulated nvmlDevice_t: the index of an emulated GPU."""

    index: int


def _nvml() -> Any:
    return sys.modules[_MODULE]


def _error(code_name: str) -> Exception:
    nvml = _nvml()
    return nvml.NVMLError(getattr(nvml, code_name))  # NVMLError.__new__ picks the NVMLError_<Name> subclass


def _gpu(handle: Any) -> Any:
    if not isinstance(handle, _Handle):
        raise _error("NVML_ERROR_INVALID_ARGUMENT")
    return state.require().devices[handle.index]


def _init(*args: Any, **kwargs: Any) -> None:
    """nvmlInit / nvmlInitWithFlags / nvmlShutdown: nothing to load."""


def device_get_count() -> int:
    """nvmlDeviceGetCount: the number of emulated GPUs."""
    return len(state.require().devices)


def device_get_handle_by_index(index: int) -> _Handle:
    """nvmlDeviceGetHandleByIndex: a handle for emulated GPU `index` (NVML_ERROR_INVALID_ARGUMENT past the count)."""
    if not 0 <= int(index) < device_get_count():
        raise _error("NVML_ERROR_INVALID_ARGUMENT")
    return _Handle(int(index))


def device_get_index(handle: Any) -> int:
    """nvmlDeviceGetIndex: the handle's device index."""
    return int(_gpu(handle).index)


def device_get_name(handle: Any) -> str:
    """nvmlDeviceGetName: the emulated GPU's marketing name (the name torch.cuda.get_device_name gives)."""
    return str(_gpu(handle).spec.name)


def device_get_uuid(handle: Any) -> str:
    """nvmlDeviceGetUUID: a stable `GPU-...` id made from the GPU key and index."""
    gpu = _gpu(handle)
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'gpemu.{gpu.spec.key}.{gpu.index}')}"


def device_get_memory_info(handle: Any, version: Any = None) -> Any:
    """nvmlDeviceGetMemoryInfo: total / free / used bytes (used = total - free, contexts counted)."""
    free, total = _gpu(handle).allocator.mem_get_info()
    return types.SimpleNamespace(total=total, free=free, used=total - free, reserved=0)


def device_get_cpu_affinity(handle: Any, cpu_set_size: int) -> list[int]:
    """nvmlDeviceGetCpuAffinity: `cpu_set_size` 64-bit masks with a bit for every host CPU (one socket)."""
    _gpu(handle)
    masks = [0] * int(cpu_set_size)
    for cpu in range(os.cpu_count() or 1):
        if cpu // 64 < len(masks):
            masks[cpu // 64] |= 1 << (cpu % 64)
    return masks


def device_get_cuda_compute_capability(handle: Any) -> tuple[int, int]:
    """nvmlDeviceGetCudaComputeCapability: the emulated GPU's (major, minor)."""
    major, minor = _gpu(handle).spec.compute_capability
    return int(major), int(minor)


EMULATED = {
    "nvmlInit": _init,
    "nvmlInitWithFlags": _init,
    "nvmlShutdown": _init,
    "nvmlDeviceGetCount": device_get_count,
    "nvmlDeviceGetHandleByIndex": device_get_handle_by_index,
    "nvmlDeviceGetIndex": device_get_index,
    "nvmlDeviceGetName": device_get_name,
    "nvmlDeviceGetUUID": device_get_uuid,
    "nvmlDeviceGetMemoryInfo": device_get_memory_info,
    "nvmlDeviceGetCpuAffinity": device_get_cpu_affinity,
    "nvmlDeviceGetCudaComputeCapability": device_get_cuda_compute_capability,
}


def _not_supported(name: str) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise _error("NVML_ERROR_NOT_SUPPORTED")

    fn.__name__ = name
    return fn


# pynvml's own Python helpers (error classes and strings, struct conversion): they stay as they are
_HELPERS = frozenset({"nvmlErrorString", "nvmlExceptionClass", "nvmlFriendlyObjectToStruct",
                      "nvmlStructToFriendlyObject"})


def apply(patcher: Any) -> None:
    """Answer pynvml's calls from the emulation (Note [Emulated NVML]); a no-op when pynvml is not installed."""
    if _MODULE not in sys.modules and importlib.util.find_spec(_MODULE) is None:
        return
    module = importlib.import_module(_MODULE)
    if not hasattr(module, "NVMLError"):  # some other package named pynvml
        return
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type) and name not in _HELPERS:
            patcher.set(module, name, EMULATED.get(name) or _not_supported(name))
