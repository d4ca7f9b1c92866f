"""Legacy CUDA tensor types on the emulated device: torch.cuda.FloatTensor(...), t.type(torch.cuda.FloatTensor), ...

Pre-1.0 idioms still common in public repositories (GAN collections, older detection code):
`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor; Tensor(n, 1).fill_(1.0)`, `imgs.type(Tensor)`,
`isinstance(x, torch.cuda.FloatTensor)`, `x.type()` == "torch.cuda.FloatTensor" and
`torch.set_default_tensor_type(torch.cuda.FloatTensor)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from gpemu.torch_backend.tensor import EmuTensor

DTYPES: dict[str, torch.dtype] = {
    "FloatTensor": torch.float32,
    "DoubleTensor": torch.float64,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "LongTensor": torch.int64,
    "IntTensor": torch.int32,
    "ShortTensor": torch.int16,
    "CharTensor": torch.int8,
    "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class _LegacyCudaType(type):
    """Metaclass of the emulated torch.cuda.<X>Tensor types: calling builds an emulated tensor; isinstance checks."""

    dtype: torch.dtype

    def __call__(cls, *args: Any, device: Any = None) -> torch.Tensor:
        target = device if device is not None else "cuda"
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0].to(target, cls.dtype)
        if not args or all(isinstance(a, int) for a in args) or (len(args) == 1 and isinstance(args[0], torch.Size)):
            size = tuple(args[0]) if len(args) == 1 and isinstance(args[0], torch.Size) else args
            return torch.empty(size if args else (0,), dtype=cls.dtype, device=target)
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=target)
        raise TypeError(f"torch.cuda.{cls.__name__}(): expected sizes, a torch.Size, a sequence or a tensor")

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, EmuTensor) and obj.dtype == cls.dtype

    def __repr__(cls) -> str:
        return f"<class 'torch.cuda.{cls.__name__}'>"


LEGACY_TYPES: dict[str, _LegacyCudaType] = {
    name: _LegacyCudaType(name, (), {"dtype": dtype, "is_cuda": True, "__module__": "torch.cuda"})
    for name, dtype in DTYPES.items()
}


def _type_target(spec: Any) -> tuple[bool, torch.dtype] | None:
    """Return (is_cuda, dtype) that a Tensor.type() argument names, or None when torch should handle it."""
    if isinstance(spec, _LegacyCudaType):
        return True, spec.dtype
    if isinstance(spec, type) and spec.__module__ == "torch" and spec.__name__ in DTYPES:  # torch.FloatTensor & co
        return False, DTYPES[spec.__name__]
    if isinstance(spec, str):
        module, _, name = spec.rpartition(".")
        if module in ("torch.cuda", "torch") and name in DTYPES:
            return module == "torch.cuda", DTYPES[name]
    return None


def patched_type(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Return Tensor.type that names emulated tensors `torch.cuda.<X>Tensor` and converts to the legacy cuda types."""

    @functools.wraps(orig)
    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None:
            if isinstance(self, EmuTensor):
                return f"torch.cuda.{_NAMES.get(self.dtype, 'Tensor')}"
            return orig(self, **kwargs)
        target = _type_target(dtype)
        if target is None or (not target[0] and not isinstance(self, EmuTensor)):
            return orig(self, dtype, non_blocking, **kwargs)
        is_cuda, to_dtype = target
        if is_cuda:
            device = self.device if isinstance(self, EmuTensor) else "cuda"
            return self.to(device, to_dtype, non_blocking=non_blocking)
        return self.to("cpu", to_dtype)

    return type_


# Note [Legacy constructor under a cuda default type]: `torch.set_default_tensor_type(torch.cuda.FloatTensor)` sets
# torch's default tensor type, not only its default device: besides the factories (torch.ones, torch.linspace, which
# gpemu routes through `set_default_device("cuda")`), the legacy constructor `torch.Tensor(data)` / `torch.Tensor(n)`
# builds tensors of that type, so on a GPU it returns a cuda tensor. `set_default_device` does not reach it (torch
# leaves `torch.Tensor(...)` on the CPU under a default device), and gpemu never sets torch's real default type to a
# cuda one (there is no CUDA), so `torch.Tensor([1e10])` stayed a CPU tensor. yenchenlin/nerf-pytorch's run_nerf.py
# (which sets the cuda type in `__main__`) died in its first step: `torch.cat([dists, torch.Tensor([1e10]).expand(...)])`
# raised "Expected all tensors to be on the same device" where a GPU runs. While a cuda default type is set,
# `torch.Tensor(...)` itself (not its subclasses) builds what `torch.cuda.<default dtype>Tensor(...)` builds.
_cuda_default_type = False


def _patched_tensor_new(orig: Any) -> Callable[..., Any]:
    """Return torch.Tensor.__new__ that builds emulated tensors while a cuda default tensor type is set."""

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if cls is torch.Tensor and _cuda_default_type and (device is None or torch.device(device).type == "cuda"):
            legacy_cls = LEGACY_TYPES.get(_NAMES.get(torch.get_default_dtype(), ""), LEGACY_TYPES["FloatTensor"])
            return legacy_cls(*args, **kwargs)
        return orig(cls, *args, **kwargs)

    return __new__


def patched_set_default_tensor_type(orig: Callable[..., Any], patcher: Any = None) -> Callable[..., Any]:
    """Return torch.set_default_tensor_type that maps a legacy cuda type to a cuda default device and dtype."""

    @functools.wraps(orig)
    def set_default_tensor_type(t: Any) -> None:
        global _cuda_default_type
        target = _type_target(t)
        if target is None or not target[0]:
            if target is not None:
                torch.set_default_device(None)
            _cuda_default_type = False
            orig(t)
            return
        torch.set_default_dtype(target[1])
        torch.set_default_device("cuda")
        if patcher is not None and "__new__" not in torch.Tensor.__dict__:  # Note [Legacy constructor under a cuda ...]
            patcher.set(torch.Tensor, "__new__", _patched_tensor_new(torch.Tensor.__new__))
        _cuda_default_type = True

    return set_default_tensor_type


def apply(patcher: Any) -> None:
    """Install the legacy cuda tensor types, Tensor.type and torch.set_default_tensor_type through `patcher`."""
    global _cuda_default_type
    _cuda_default_type = False
    patcher.on_restore(_reset_default_type)
    for name, cls in LEGACY_TYPES.items():
        patcher.set(torch.cuda, name, cls)
    patcher.set(torch.Tensor, "type", patched_type(torch.Tensor.type))
    patcher.set(torch, "set_default_tensor_type",
                patched_set_default_tensor_type(torch.set_default_tensor_type, patcher))


def _reset_default_type() -> None:
    global _cuda_default_type
    _cuda_default_type = False
