"""Nested tensors (`torch.nested`) on the emulated device: refused with an error that names the API and a workaround.

Note [Nested tensors]: a strided nested tensor's C++ NestedTensorImpl must own CPU/CUDA storage (torch asserts it:
"NestedTensorImpl storage must be either CUDA, CPU, ..."), and gpemu's tensors are backed by meta storage; a jagged
nested tensor is a Python subclass whose symbolic sizes cannot wrap an EmuTensor. Before session 8 the three ways in
died inside torch with internal errors (pytorch/tutorials scaled_dot_product_attention_tutorial.py builds a padded
batch with `torch.nested.nested_tensor([...], device="cuda")`): an INTERNAL ASSERT from NestedTensorImpl.cpp
(strided, from emulated components), `'NestedIntNode' object has no attribute 'add'` (jagged), and "NestedTensorImpl
doesn't support sizes" (`.cuda()` of a CPU nested tensor). gpemu now raises an UnsupportedOpError for each, naming
the call and the workaround (a padded dense batch, `torch.nested.to_padded_tensor` on the CPU, plus a mask).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend.tensor import EmuTensor

_WORKAROUND = ("Workaround: pad the sequences to one dense tensor (on the CPU: `torch.nested.to_padded_tensor(nt, 0.0)`"
               " or `torch.nn.utils.rnn.pad_sequence`) and move that, with a mask if the model needs one.")


def nested_error(api: str) -> UnsupportedOpError:
    """Return the error for nested tensors on the emulated device, naming `api` (Note [Nested tensors])."""
    return UnsupportedOpError(
        f"gpemu cannot emulate nested tensors on the emulated CUDA device ({api}): torch's NestedTensorImpl needs real "
        f"CPU/CUDA storage and gpemu's tensors are meta-backed. {_WORKAROUND}")


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


def _touches_device(args: Any, kwargs: dict[str, Any]) -> bool:
    if _is_cuda(kwargs.get("device")):
        return True
    stack = list(args) + [v for k, v in kwargs.items() if k != "device"]
    while stack:
        item = stack.pop()
        if isinstance(item, EmuTensor):
            return True
        if isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _patched_constructor(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def constructor(*args: Any, **kwargs: Any) -> Any:
        if _touches_device(args, kwargs):
            raise nested_error(f"torch.nested.{name}")
        return orig(*args, **kwargs)

    return constructor


def apply(patcher: Any) -> None:
    """Make torch.nested's constructors refuse emulated tensors and devices with a clear error."""
    for name in ("nested_tensor", "as_nested_tensor", "nested_tensor_from_jagged", "narrow"):
        if hasattr(torch.nested, name):
            patcher.set(torch.nested, name, _patched_constructor(name, getattr(torch.nested, name)))
