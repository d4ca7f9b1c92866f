"""gpemu: a GPU emulator for deep-learning systems research (timing, memory and concurrency; never values)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpemu.errors import GpemuError, GpemuWarning, UnknownNameError
from gpemu.estimate import Estimate
from gpemu.hardware import GPUSpec, get_gpu, list_gpus

if TYPE_CHECKING:
    from gpemu.device.api import Emulator
    from gpemu.torch_backend import install, uninstall

__version__ = "0.1.0"

__all__ = [
    "Emulator",
    "Estimate",
    "GPUSpec",
    "GpemuError",
    "GpemuWarning",
    "UnknownNameError",
    "__version__",
    "get_gpu",
    "install",
    "list_gpus",
    "uninstall",
]

# Heavy parts (torch patches, the timeline API) load on first use, so `import gpemu` stays cheap.
_LAZY = {
    "Emulator": ("gpemu.device.api", "Emulator"),
    "install": ("gpemu.torch_backend", "install"),
    "uninstall": ("gpemu.torch_backend", "uninstall"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpemu' has no attribute {name!r}")
