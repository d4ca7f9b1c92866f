"""Autograd saving policy of older torch: in-place hardtanh_ (ReLU6) saving its result instead of a copy of its input.

See Note [hardtanh_ saves a copy of its input].
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

import torch

# Note [hardtanh_ saves a copy of its input]
# Since torch 1.10 (pytorch#62329, which made the hardtanh derivative use `self` to fix XLA), the in-place
# `hardtanh_` has no derivative entry of its own; autograd's generated kernel therefore clones the input before
# modifying it (`original_self = self.clone()`) and saves the clone (HardtanhBackward0._saved_self). Every
# nn.ReLU6(inplace=True) / nn.Hardtanh(inplace=True) in training thus costs one more activation-sized tensor that
# lives until backward, on every device (the kernel is device independent): pytorch#81548 and #95432 (open), fix
# proposed in #190506. torch <= 1.9 had `hardtanh_: self: hardtanh_backward(grad, result, ...)` (HardtanhBackward1),
# saving the result, which shares the activation's storage: no extra memory.
# GPEmu's reference measurements were taken with such a torch: mobilenet_v2 (35 ReLU6 in place) peaks at
# 1722.3 MiB at batch 32 on a V100, which the result-saving rule reproduces (1725.8 MiB) and the clone rule
# overshoots by 44% (2472.6 MiB); hardswish_/hardsigmoid_ saved a clone in both eras (mobilenet_v3_small matches
# either way). `legacy_hardtanh()` installs, for meta tensors only and only while active, an AutogradMeta kernel
# for aten::hardtanh_ that implements the torch <= 1.9 rule; predict_memory(..., hardtanh_inplace_clone=True)
# keeps the installed torch's rule (what a real GPU running torch >= 1.10 allocates).

_lock = threading.Lock()
_depth = 0
_library: torch.library.Library | None = None


class _HardtanhInplaceSavingResult(torch.autograd.Function):
    """hardtanh_ whose backward reads the saved result (torch <= 1.9), so nothing is copied."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, min_val: float, max_val: float) -> torch.Tensor:  # type: ignore[override]
        with torch._C._AutoDispatchBelowAutograd():
            torch.ops.aten.hardtanh_.default(x, min_val, max_val)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.min_val, ctx.max_val = min_val, max_val
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (result,) = ctx.saved_tensors
        return torch.ops.aten.hardtanh_backward.default(grad, result, ctx.min_val, ctx.max_val), None, None


def _hardtanh_inplace(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    return _HardtanhInplaceSavingResult.apply(x, min_val, max_val)  # type: ignore[no-any-return]


@contextlib.contextmanager
def legacy_hardtanh() -> Iterator[None]:
    """Return a context in which meta-tensor hardtanh_ saves its result for backward, as torch <= 1.9 did."""
    global _depth, _library
    with _lock:
        if _depth == 0:
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "overriding a previously registered kernel" is the point
                lib.impl("hardtanh_", _hardtanh_inplace, "AutogradMeta")
            _library = lib
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _library is not None:
                _library._destroy()
                _library = None


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Within the block, dropout on meta tensors runs CUDA's fused `native_dropout` (a 1-byte mask saved, not a noise
    tensor in the input dtype); see Note [Fused dropout] in gpemu/torch_backend/dropout.py."""
    from torch import _VF

    from gpemu.torch_backend.dropout import patched

    original = _VF.dropout
    _VF.dropout = patched(original, lambda t: isinstance(t, torch.Tensor) and t.device.type == "meta")
    try:
        yield
    finally:
        _VF.dropout = original


@contextlib.contextmanager
def cuda_sdpa(capability: tuple[int, int]) -> Iterator[None]:
    """Within the block, `F.scaled_dot_product_attention` on meta tensors uses the fused kernel a GPU of `capability`
    would (no score matrix held); see Note [SDPA backend choice] in gpemu/torch_backend/sdpa.py."""
    import torch.nn.functional as F

    from gpemu.torch_backend.sdpa import patched_for_meta

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = patched_for_meta(original, capability)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
