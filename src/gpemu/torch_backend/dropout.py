"""`F.dropout` on the emulated GPU runs CUDA's fused kernel (`native_dropout`): one kernel, a 1-byte mask saved.

Note [Fused dropout]: ATen's `dropout` takes the fused `native_dropout` only for CUDA (and a few other) devices; on
our meta-backed tensors it took the composite path instead (`empty_like(x).bernoulli_(1 - p)`, `div_`, `mul`): three
kernels, and a noise tensor in the input's dtype saved for backward (4 bytes per element in fp32, where CUDA keeps a
1-byte bool mask). For emulated inputs with 0 < p < 1 in training, gpemu calls `aten.native_dropout` as CUDA does;
its autograd formula (`native_dropout_backward`) and meta kernel do the rest. In-place dropout (`dropout_`) is
unfused on CUDA too and keeps torch's path. The memory predictor (`gpemu.memory`, plain meta tensors) applies the same
rule while it simulates (`gpemu.memory.autograd_compat.cuda_dropout`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from gpemu.torch_backend.tensor import EmuTensor


def _emulated(t: Any) -> bool:
    return isinstance(t, EmuTensor)


def patched(original: Callable[..., Any], applies: Callable[[Any], bool] = _emulated) -> Callable[..., Any]:
    """Return a `_VF.dropout` that runs inputs for which `applies` holds (default: emulated tensors) through the
    fused kernel (Note [Fused dropout])."""

    @functools.wraps(original)
    def dropout(input: Any, p: float, train: bool) -> Any:
        if applies(input) and train and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, train)[0]
        return original(input, p, train)

    return dropout


def apply(patcher: Any) -> None:
    """Install the fused `_VF.dropout` through `patcher`."""
    from torch import _VF

    patcher.set(_VF, "dropout", patched(_VF.dropout))
