"""A plain per-op roofline: FLOPs (torch's flop registry) and bytes moved, against the GPU's peaks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from gpemu.hardware import GPUSpec

# Efficiencies of a plain roofline (fractions of peak actually reached by typical kernels). See Note [Roofline
# efficiencies]: these are placeholders that gpemu.cost's fitted model replaces; they are only used when no
# calibrated model is available.
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.7

_DTYPE_KEY = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int8: "int8",
}


def _tensors(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def op_flops(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return the FLOPs of one aten op from torch's flop registry (0 for ops it does not count)."""
    packet = getattr(func, "overloadpacket", func)
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    shapes = lambda tree: tree_flatten(tree)[0]  # noqa: E731
    args_shapes = [a.shape if isinstance(a, torch.Tensor) else a for a in args]
    kwargs_shapes = {k: (v.shape if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    out_leaves = shapes(out)
    out_shape = out_leaves[0].shape if out_leaves and isinstance(out_leaves[0], torch.Tensor) else None
    try:
        return int(formula(*args_shapes, out_shape=out_shape, **kwargs_shapes))
    except TypeError:
        return 0


def op_bytes(args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return bytes read plus written by one op (inputs + outputs, each counted once)."""
    seen: set[int] = set()
    total = 0
    for t in _tensors((args, kwargs, out)):
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def op_time_s(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any, spec: GPUSpec) -> float:
    """Return the roofline time of one aten op on `spec` in seconds (kernel time, no launch overhead)."""
    flops = op_flops(func, args, kwargs, out)
    nbytes = op_bytes(args, kwargs, out)
    dtype = next((t.dtype for t in _tensors(args) if t.is_floating_point()), torch.float32)
    peak = spec.peak_flops(_DTYPE_KEY.get(dtype, "fp32"))
    compute_s = flops / (peak * COMPUTE_EFFICIENCY) if flops else 0.0
    memory_s = nbytes / (spec.memory_bw_bytes_per_s * BANDWIDTH_EFFICIENCY)
    return max(compute_s, memory_s)
