"""Autocast emulation: under torch.autocast("cuda"), matmul/conv ops run (and are priced) in the autocast dtype.

See Note [Autocast on meta]: the C++ AutocastCUDA key only fires for tensors with a CUDA backend key; emulated tensors
are meta underneath, so gpemu casts the inputs of autocast's low-precision op list itself. Backward then sees
low-precision gradients next to fp32 saved inputs (autograd saved the originals, not the casts); for the same op list
mixed float dtypes are unified to the lowest precision, as autocast's saved casts would be on a real GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.hardware import GPUSpec

aten = torch.ops.aten

# aten overload packets autocast runs in fp16/bf16 on CUDA (torch/csrc/autograd autocast_mode.cpp "lower_precision_fp"
# list, reduced to the aten ops that reach the Python dispatch key).
_LOWP = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.addbmm,
    aten.convolution,
    aten.convolution_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten.prelu,
    aten.addmv,
    aten.mv,
}
_LOWP_DTYPES = (torch.float16, torch.bfloat16)


def adjust_for_autocast(
    func: Any, uargs: Any, ukwargs: Any, spec: GPUSpec, autocast_dtype: Any = None
) -> tuple[Any, Any, float]:
    """Return (args, kwargs, cast_seconds) with floating inputs cast to the autocast dtype for low-precision ops."""
    if func.overloadpacket not in _LOWP:
        return uargs, ukwargs, 0.0
    if autocast_dtype is not None:
        target = autocast_dtype
    else:
        dtypes = {t.dtype for t in _float_tensors(uargs)}
        low = [d for d in _LOWP_DTYPES if d in dtypes]
        if not low or len(dtypes) < 2:
            return uargs, ukwargs, 0.0
        target = low[0]
    cast_bytes = 0

    def cast(x: Any) -> Any:
        nonlocal cast_bytes
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != target:
            cast_bytes += x.numel() * (x.element_size() + torch.finfo(target).bits // 8)
            return x.to(target)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v) for v in x)
        return x

    new_args = tuple(cast(a) for a in uargs)
    new_kwargs = {k: cast(v) for k, v in ukwargs.items()}
    return new_args, new_kwargs, cast_bytes / spec.memory_bw_bytes_per_s


def _float_tensors(tree: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for x in tree:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _float_tensors(x)
    return out
