"""Per-op kernel time for the torch backend: the fitted roofline of gpemu.cost.model, cached by op signature."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gpemu.cost.model import COMPUTE_PARAMS, CostParams, _compute_idx, _mem_param, load_params, peak_flops
from gpemu.cost.registry import OpCost, io_bytes, op_cost
from gpemu.hardware import GPUSpec

# Kept for callers of the first seam; the fitted model supersedes these (see Note [Time model] in model.py).
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.7

_cache: dict[tuple[Any, ...], float] = {}
_CACHE_LIMIT = 200_000


def _sig(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_sig(i) for i in x)
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)):
        return x
    return type(x).__name__


def op_flops(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return the FLOPs of one aten op from the gpemu.cost registry (0 for ops it does not count)."""
    return int(op_cost(func, args, kwargs, out).flops)


def op_bytes(args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return bytes read plus written by one op (every tensor input + every tensor output)."""
    return io_bytes(args, kwargs, out)


def cost_time_s(cost: OpCost, name: str, spec: GPUSpec, params: CostParams | None = None) -> float:
    """Return the fitted model's kernel seconds for one op's cost on `spec` (0 for views; no launch overhead)."""
    if cost.category == "view":
        return 0.0
    params = params or load_params()
    p, f = params.shared, params.factors(spec)
    cidx = _compute_idx(cost.category, name)
    compute = 0.0
    if cidx >= 0:
        peak = peak_flops(spec, cost.dtype, cost.category, cost.tensor_core, params.tc_rel)
        compute = (cost.flops + p["w_half"] * spec.sm_count) / (peak * p[COMPUTE_PARAMS[cidx]] * f["a"])
    memory = (cost.bytes + p["b_half"] * spec.sm_count) / (spec.memory_bw_gbps * 1e9 * p[_mem_param(cost.category)]
                                                           * f["b"])
    return max(compute, memory) + p["k0"]


def op_time_s(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any, spec: GPUSpec) -> float:
    """Return one aten op's kernel seconds on `spec` (fitted roofline, no launch overhead), cached by signature."""
    key = (func, spec.key, _sig(args), _sig(tuple(kwargs.items())) if kwargs else None)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    from gpemu.cost.registry import op_name

    value = cost_time_s(op_cost(func, args, kwargs, out), op_name(func), spec)
    if len(_cache) >= _CACHE_LIMIT:
        _cache.clear()
    _cache[key] = value
    return value


def clear_cache() -> None:
    """Forget cached op times (after refitting or editing the catalog)."""
    _cache.clear()
