"""Per-op kernel time for the torch backend: the fitted roofline of gpemu.cost.model, cached by op signature."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from gpemu.cost.model import (
    COMPUTE_PARAMS,
    CONV_COMPUTE_PARAMS,
    LAYOUT_NCHW,
    LAYOUT_NHWC,
    CostParams,
    attention_shape_scale,
    bn_channel_rate,
    bn_plane,
    column_bytes_per_flop,
    compute_param_index,
    conv_group_width,
    conv_out_channels,
    fused_attention_eff,
    group_efficiency,
    is_pointwise_conv,
    issue_bound_pool,
    layer_norm_row_ramp,
    load_params,
    lowered_conv,
    lowered_kernels_per_sample,
    mem_param,
    past_single_read,
    peak_flops,
    plane_efficiency,
    pool_rate,
    staged_conv,
    streams,
    streams_physically,
    transposed_tensors,
    uses_tensor_cores,
    warpgroup_gemms,
)
from gpemu.cost.registry import OpCost, io_bytes, op_cost
from gpemu.hardware import GPUSpec

# Kept for callers of the first seam; the fitted model supersedes these (see Note [Time model] in model.py).
COMPUTE_EFFICIENCY = 0.6
BANDWIDTH_EFFICIENCY = 0.7

_cache: dict[tuple[Any, ...], float] = {}
_CACHE_LIMIT = 200_000


_Tensor = torch.Tensor
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _sig(args: Sequence[Any]) -> tuple[Any, ...]:
    """Return a hashable signature of op arguments: tensors by (shape, dtype), lists of ints as tuples."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, _Tensor):
            out.append(a.shape)
            out.append(a.dtype)
            if a.dim() == 4:  # the memory format prices convolutions and batch norm (Note [Layout cost])
                out.append(a.stride())
        elif isinstance(a, (list, tuple)):
            scalars = True
            for i in a:
                if not isinstance(i, _SCALARS):
                    scalars = False
                    break
            out.append(tuple(a) if scalars else _sig(a))
        elif isinstance(a, _SCALARS):
            out.append(a)
        else:
            out.append(type(a).__name__)
    return tuple(out)


def op_flops(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return the FLOPs of one aten op from the gpemu.cost registry (0 for ops it does not count)."""
    return int(op_cost(func, args, kwargs, out).flops)


def op_bytes(args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    """Return bytes read plus written by one op (every tensor input + every tensor output)."""
    return io_bytes(args, kwargs, out)


def cost_time_s(cost: OpCost, name: str, spec: GPUSpec, params: CostParams | None = None,
                plane: float = math.inf, pointwise: bool = False, group_width: float = 1.0,
                out_channels: float = 0.0, samples: float = 0.0, attn_scale: float = 1.0,
                row_ramp: float = 1.0) -> float:
    """Return the fitted model's kernel seconds for one op's cost on `spec` (0 for views; no launch overhead);
    `plane` is a batch-norm op's H*W (Note [Batch-norm plane size]); `pointwise` marks a 1x1 convolution (Note
    [Pointwise convolutions]); `out_channels` and `samples` a dense convolution's (Note [bf16 convolutions before
    Ampere]); `attn_scale` a fused attention op's shape factor (Note [Attention kernels on Hopper]); `row_ramp` a layer
    norm's row-length factor (Note [Layer-norm row length])."""
    if cost.category == "view":
        return 0.0
    params = params or load_params()
    p, f = params.shared, params.factors(spec)
    lowered = lowered_conv(spec, cost.dtype, cost.category)  # See Note [bf16 convolutions before Ampere]
    cidx = compute_param_index(cost.category, name, pointwise or lowered)
    compute = 0.0
    on_tc = False
    if cidx >= 0:
        peak = peak_flops(spec, cost.dtype, cost.category, cost.tensor_core, cost.gemm_align)
        on_tc = uses_tensor_cores(spec, cost.dtype, cost.category, cost.tensor_core)
        e_c = p[COMPUTE_PARAMS[cidx]]
        if cidx in (2, 3) and group_width > 1:  # See Note [Group width]
            dense = p["e_conv_1x1_bwd" if cidx == 3 else "e_conv_1x1"]
            e_c = float(group_efficiency(e_c, dense, group_width, p["group_width_half"]))
        eff = e_c * f["a"]
        if on_tc:  # Note [Tensor-core efficiency], Note [Fused attention efficiency]
            tc = params.tc_eff_for(spec)  # Note [Half-rate tensor cores]
            eff = fused_attention_eff(spec, tc) if cost.category == "attention" else tc
            if cost.category == "attention" and warpgroup_gemms(spec):  # Note [Attention kernels on Hopper]
                eff *= attn_scale
            if cidx in CONV_COMPUTE_PARAMS:  # See Note [Tensor-core convolution factor] in model.py
                eff *= f["t"]
        compute = (cost.flops + p["w_half"] * spec.sm_count) / (peak * eff)
    backward = name.endswith(("_backward", "_backward_data"))  # the phase is unknown here; named grads are bwd
    staged = bool(staged_conv(np.array([cidx]), np.array([on_tc]))[0])  # See Note [Staged convolutions]
    m_ceiling = p[("m_conv_bwd" if backward else "m_conv") if staged else mem_param(cost.category, backward)]
    m_copy = p[mem_param("elementwise", backward)]
    if cost.layout == "nhwc" and cost.category == "norm":  # See Note [Layout cost]: no plane ramp
        plane = math.inf
    ramp = float(plane_efficiency(plane, p["bn_plane_half"])) * row_ramp
    bw = spec.load_memory_bw_gbps * 1e9 * f["b"]
    m_eff = m_ceiling * ramp
    if streams(spec, cost.dtype, cost.category, name, params.m_stream):
        bw, m_eff = spec.load_memory_bw_gbps * 1e9, params.m_stream * ramp  # Note [16-bit streaming]
    latency = p["mem_lat_cycles"] / (spec.load_clock_mhz * 1e6)  # Note [Sustained clock]
    nbytes = cost.bytes + (cost.flops * float(column_bytes_per_flop(out_channels)) if lowered else 0.0)
    memory = nbytes / (bw * m_eff) + latency
    if cost.channel_elems and past_single_read(cost.channel_elems, cost.dtype):  # Note [Batch norm, one block per
        # channel] in model.py
        memory = max(memory, cost.channel_elems / (bn_channel_rate(name) * spec.load_clock_mhz * 1e6) + latency)
    if issue_bound_pool(cost.category, name):  # See Note [Pooling kernels are issue-bound] in model.py
        memory = max(memory, cost.flops / (pool_rate(name) * spec.sm_count * spec.load_clock_mhz * 1e6) + latency)
    total = (compute + memory if staged or lowered else max(compute, memory)) + p["k0"]
    if lowered and samples > 1:  # the per-sample loop's kernels: Note [bf16 convolutions before Ampere]
        total += (lowered_kernels_per_sample(name, pointwise) * samples - 1) * (latency + p["k0"])
    if cost.category == "conv" and cost.layout and cost.relayout_bytes:
        layout = LAYOUT_NHWC if cost.layout == "nhwc" else LAYOUT_NCHW
        moved = transposed_tensors(spec, cost.dtype, cost.tensor_core, layout, backward)  # Note [Layout cost]
        if moved:
            bw_copy = spec.load_memory_bw_gbps * 1e9 * f["b"]
            if streams_physically(spec, cost.dtype, params.m_stream):  # Note [16-bit streaming]
                bw_copy, m_copy = spec.load_memory_bw_gbps * 1e9, params.m_stream
            total += 2 * cost.relayout_bytes / (bw_copy * m_copy) + moved * (latency + p["k0"])
    return total


# Note [FP32 math modes]: on a GPU with TF32 tensor cores an fp32 GEMM runs on them when
# `torch.backends.cuda.matmul.allow_tf32` is set (`torch.set_float32_matmul_precision("high")` sets it; off by
# default), and an fp32 convolution unless `torch.backends.cudnn.allow_tf32` is cleared (on by default). The model's
# fp32 default follows torch's defaults (TF32 convolutions, IEEE GEMMs: Note [Time model]); a script that changes
# either flag changed nothing, although the two paths differ ~8x in peak on an A100 (156 vs 19.5 TFLOPS). op_time_s
# now prices fp32 matmul/attention as "tf32" under the first flag and fp32 convolutions as "fp32_ieee" (CUDA cores,
# NCHW-native) without the second.
FP32_IEEE = "fp32_ieee"


def _tf32(*levels: Any) -> bool:
    """Return whether the first `fp32_precision` in `levels` that is not "none" is "tf32" (torch's inheritance)."""
    for level in levels:
        value = getattr(level, "fp32_precision", "none")
        if value != "none":
            return bool(value == "tf32")
    return False


def fp32_math_modes() -> tuple[bool, bool]:
    """Return (fp32 GEMMs on TF32, fp32 convolutions on TF32) as torch's flags set them (Note [FP32 math modes]).
    Reads the fp32_precision API (the legacy allow_tf32 getters raise once a script mixed the two APIs)."""
    backends = torch.backends
    try:
        return (_tf32(backends.cuda.matmul, backends.cuda, backends),
                _tf32(getattr(backends.cudnn, "conv", None), backends.cudnn, backends))
    except (AttributeError, RuntimeError):  # a torch without fp32_precision
        return bool(backends.cuda.matmul.allow_tf32), bool(backends.cudnn.allow_tf32)


def with_fp32_modes(cost: OpCost, spec: GPUSpec, modes: tuple[bool, bool]) -> OpCost:
    """Return `cost` with its dtype set by the fp32 math modes on a TF32-capable `spec` (Note [FP32 math modes])."""
    if cost.dtype != "fp32" or not spec.peak_tflops.get("tf32", 0.0):
        return cost
    if cost.category in ("matmul", "attention") and modes[0]:
        return replace(cost, dtype="tf32")
    if cost.category == "conv" and not modes[1]:
        return replace(cost, dtype=FP32_IEEE)
    return cost


# Note [Dilated convolutions]: e_conv / e_conv_bwd are above 1 because cuDNN runs spatial convolutions on CUDA cores
# with Winograd / FFT algorithms that do fewer multiplies (Note [Pointwise convolutions] in model.py). cuDNN has
# neither for a dilated convolution (its Winograd and FFT kernels take dilation 1 only): it runs implicit-GEMM
# kernels, as for a 1x1 convolution. The fitted data (torchvision classification networks) has no dilated
# convolution, so the Winograd efficiency was extrapolated to them: DeepLabV3's ASPP (3x3, dilation 12-36) and FCN's
# dilated ResNet layers were priced above the fp32 peak on CUDA cores (a 960->256 ASPP convolution on a T4 at 13.2
# TFLOP/s against its 8.1, on a V100 at 28.1 against 15.7). A dilated convolution is now priced as a pointwise
# one: the GEMM efficiencies e_conv_1x1 / e_conv_1x1_bwd (capped at 1 in the fit), one kernel (no staged
# transforms). Tensor-core convolutions (TF32, 16-bit) are priced at tc_eff either way and do not change.
_DILATION_ARG = {"convolution": 5, "_convolution": 5, "conv1d": 5, "conv2d": 5, "conv3d": 5,
                 "convolution_backward": 6}


def is_dilated_conv(name: str, category: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Return True for a dense convolution (forward or backward) with a dilation above 1 (Note [Dilated
    convolutions])."""
    idx = _DILATION_ARG.get(name)
    if category != "conv" or idx is None:
        return False
    dilation = args[idx] if len(args) > idx else kwargs.get("dilation", 1)
    if isinstance(dilation, int):
        return dilation > 1
    return isinstance(dilation, (list, tuple)) and any(int(d) > 1 for d in dilation)


def op_time_s(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any, spec: GPUSpec) -> float:
    """Return one aten op's kernel seconds on `spec` (fitted roofline, no launch overhead), cached by signature."""
    modes = fp32_math_modes()
    key = (func, spec.key, modes, _sig(args), _sig(list(kwargs.values())) + tuple(kwargs) if kwargs else None)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    from gpemu.cost.registry import op_name

    name = op_name(func)
    first = args[0] if args else None
    plane = bn_plane(name, tuple(first.shape)) if isinstance(first, torch.Tensor) else math.inf
    cost = with_fp32_modes(op_cost(func, args, kwargs, out), spec, modes)
    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    pointwise = is_pointwise_conv(name, cost.category, shapes) or is_dilated_conv(name, cost.category, args, kwargs)
    value = cost_time_s(cost, name, spec, plane=plane, pointwise=pointwise,
                        group_width=conv_group_width(name, cost.category, shapes),
                        out_channels=conv_out_channels(name, cost.category, shapes),
                        samples=float(shapes[0][0]) if cost.category == "conv" and shapes and shapes[0] else 0.0,
                        attn_scale=attention_shape_scale(name, shapes, cost.flops) if cost.category == "attention"
                        else 1.0, row_ramp=layer_norm_row_ramp(name, shapes[0], spec) if shapes else 1.0)
    if len(_cache) >= _CACHE_LIMIT:
        _cache.clear()
    _cache[key] = value
    return value


def clear_cache() -> None:
    """Forget cached op times (after refitting or editing the catalog)."""
    _cache.clear()
