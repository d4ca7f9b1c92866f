"""torch.accelerator's memory and capability queries and the device-generic torch.Stream / torch.Event on emulated GPUs.

Note [Device-generic streams and events]: torch 2.5+ offers device-generic `torch.Stream(device)` and
`torch.Event(device, enable_timing=...)` beside torch.cuda's classes, and torch.accelerator's API (which the
pytorch/examples scripts now use instead of torch.cuda) hands them around. They are C++ classes that ask the CUDA
driver at construction or on `record()`, so under emulation they failed with "CUDA driver version is insufficient".
gpemu replaces `torch.Stream` and `torch.Event` with classes whose construction returns an emulated stream or event
(gpemu's torch.cuda.Stream / torch.cuda.Event: the same timeline, so `elapsed_time` is emulated GPU time) for a cuda
device or the default device (the current accelerator is the emulated cuda), and torch's own object for any other
device. `isinstance(x, torch.Stream)` holds for both kinds.
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.torch_backend import cuda_api


def _is_emulated_device(device: Any) -> bool:
    """Return True when `device` (None, an index, a string or a torch.device) names the emulated accelerator."""
    if device is None or isinstance(device, int):
        return True
    if isinstance(device, str):
        device = torch.device(device)
    return isinstance(device, torch.device) and device.type == "cuda"


class _AcceptsEmulated(type):
    """Metaclass of the generic stand-ins: isinstance/issubclass accept torch's class and gpemu's emulated one."""

    _accepted: tuple[type, ...]

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._accepted)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._accepted)


def generic_stream(orig: type) -> type:
    """Return the torch.Stream stand-in over torch's class `orig` (Note [Device-generic streams and events])."""

    def __new__(cls: type, device: Any = None, *, priority: int = 0, **kwargs: Any) -> Any:
        if _is_emulated_device(device):
            return cuda_api.Stream(device, priority)
        return orig(device, priority=priority, **kwargs)

    return _AcceptsEmulated("Stream", (), {"__new__": __new__, "_accepted": (orig, cuda_api.Stream),
                                           "__module__": "torch", "__doc__": orig.__doc__})


def generic_event(orig: type) -> type:
    """Return the torch.Event stand-in over torch's class `orig` (Note [Device-generic streams and events])."""

    def __new__(cls: type, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> Any:
        if _is_emulated_device(device):
            return cuda_api.Event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        return orig(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    return _AcceptsEmulated("Event", (), {"__new__": __new__, "_accepted": (orig, cuda_api.Event),
                                          "__module__": "torch", "__doc__": orig.__doc__})


def get_memory_info(device: Any = None) -> tuple[int, int]:
    """torch.accelerator.get_memory_info: (free, total) bytes of the emulated device, as cudaMemGetInfo."""
    return cuda_api.mem_get_info(device)


def get_device_capability(device: Any = None) -> dict[str, Any]:
    """torch.accelerator.get_device_capability: every torch dtype is supported on a CUDA device (allocation and
    conversion; which kernels exist is another matter, as torch documents)."""
    cuda_api.device_index(device)
    return {"supported_dtypes": {v for v in vars(torch).values() if isinstance(v, torch.dtype)}}


def empty_host_cache() -> None:
    """torch.accelerator.empty_host_cache: release the unused buffers of gpemu's pinned-memory pool."""
    from gpemu.host.pinned import default_pool

    default_pool().empty_cache()
