"""`torch.set_default_device("cuda")` and `with torch.device("cuda"):` on the emulated device.

See Note [Default device under emulation]: torch implements both with a TorchFunctionMode
(torch.utils._device.DeviceContext) that adds `device=` to factory calls. gpemu's factory patches are Python wrappers
around the original C++ functions, so the mode sees the originals; its `__torch_function__` is replaced by one that
routes a factory whose (given or injected) device is cuda to gpemu's wrapper, which builds an emulated tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device as device_mod


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def make_torch_function(
    constructors: set[Any], route: dict[Any, Callable[..., Any]]
) -> Callable[..., Any]:
    """Return a DeviceContext.__torch_function__ that injects the default device and routes cuda factories to gpemu."""

    def __torch_function__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in constructors and kwargs.get("device") is None:
            kwargs["device"] = self.device
        patched = route.get(func)
        if patched is not None and _is_cuda(kwargs.get("device")):
            return patched(*args, **kwargs)
        return func(*args, **kwargs)

    return __torch_function__


def original_constructors() -> set[Any]:
    """Return torch's set of factory functions that take the default device, read from the current torch attributes."""
    fn = device_mod._device_constructors
    return set(getattr(fn, "__wrapped__", fn)())


def apply(patcher: Any, constructors: set[Any], route: dict[Any, Callable[..., Any]]) -> None:
    """Patch torch's DeviceContext so default-device factories and module parameters land on the emulated GPU.

    `constructors` must be read before gpemu patches the factories (original C++ functions); `route` maps each
    original factory to gpemu's wrapper.
    """
    patcher.set(device_mod.DeviceContext, "__torch_function__", make_torch_function(constructors, route))
    # torch caches the constructor set on first use; while installed, hand out the originals so that a
    # `with torch.device("meta")` (HF-style empty init) keeps working even if the cache was never filled
    patcher.set(device_mod, "_device_constructors", lambda: constructors)


# Note [Default device under emulation]: `torch.set_default_device("cuda")` pushes a DeviceContext mode for the rest
# of the program and `with torch.device("cuda")` pushes one for the block. Both add `device=cuda` to calls of torch's
# factory list (empty, zeros, randn, tensor, arange, ...), which is also how nn.Module layers built inside the
# context get their parameters (they call torch.empty(..., device=None)). The mode sees the original C++ factory
# (gpemu's Python wrapper calls it when no cuda device was given), so the replacement `__torch_function__` sends
# every cuda-bound factory back to the wrapper with the device filled in. `torch.get_default_device()` then reports
# cuda:0 (it asks `torch.tensor([]).device`). Ops that are not factories pass through unchanged; the mode costs a
# Python call per torch API call, as it does on a real GPU.
