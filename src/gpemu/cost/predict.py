"""Phase predictions for any (GPU, model, batch, dtype): profile row, cross-GPU scaling, or the spec-only model."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch

from gpemu.cost.model import (
    BORROWED_PARAMS,
    CostParams,
    OpArrays,
    compress_views,
    host_seconds,
    kernel_seconds,
    load_params,
    op_arrays,
    phase_seconds,
    spec_columns,
)
from gpemu.cost.similarity import nearest, source_distance, spec_distance  # noqa: F401 (re-exported)
from gpemu.errors import GpemuError, UnknownNameError
from gpemu.estimate import Estimate
from gpemu.hardware import GPUSpec, get_gpu, list_gpus

MEMORY_FORMATS: tuple[str, ...] = ("nchw", "channels_last")  # as gpemu.workloads.optrace.MEMORY_FORMATS

PREDICT_PHASES: tuple[str, ...] = ("forward", "backward", "backward_only", "optimizer", "inference")
_BASE_BATCHES = (2, 4)  # traced batch sizes from which per-op FLOPs/bytes are extended linearly in the batch size


class _DB(Protocol):
    rows: Any

    def lookup(self, gpu: Any, workload: str, phase: str, batch_size: int, dtype: str = "fp32") -> Estimate: ...


@functools.cache
def batch_linear_ops(model: str, dtype: str = "fp32", optimizer: str = "sgd-gpemu",
                     memory_format: str = "nchw") -> OpArrays:
    """Return a model's step ops with FLOPs and bytes linear in the batch size (from traces at batch 2 and 4).

    Every op of a training step is per-sample work plus batch-independent work (weights, weight gradients), so
    flops(B) = f0 + f1*B exactly; this lets one pair of cached traces price every batch size.
    """
    from gpemu.workloads.optrace import INFERENCE, trace_inference, trace_training_step

    def trace(batch_size: int) -> list[Any]:
        if optimizer == INFERENCE:  # Note [Inference forward] in gpemu.workloads.optrace
            return trace_inference(model, batch_size, dtype, memory_format=memory_format)
        return trace_training_step(model, batch_size, dtype, optimizer, memory_format=memory_format)

    if dtype == "tf32":  # fp32 tensors; conv/matmul run on TF32 tensor cores (torch.backends.*.allow_tf32 = True)
        base = batch_linear_ops(model, "fp32", optimizer, memory_format)
        compute = {"conv", "conv_grouped", "matmul", "attention"}
        return replace(base, dtype=["tf32" if c in compute else d for c, d in zip(base.category, base.dtype,
                                                                                   strict=True)])
    b1, b2 = _BASE_BATCHES
    r1, r2 = trace(b1), trace(b2)
    if [r.name for r in r1] != [r.name for r in r2]:
        raise GpemuError(f"{model}: the op sequence changes with the batch size; cannot extend it linearly")
    a1, a2 = op_arrays(r1), op_arrays(r2)
    if dtype in ("fp16", "bf16", "amp", "amp_bf16"):
        # Note [Tensor-core flags at training batch sizes]: a GEMM over batch x tokens rows (ViT's 197 tokens) is
        # misaligned at batch 2 and 4 but aligned at any multiple of 8, the batch sizes people train with; take
        # the flag from a batch-8 trace (the flag is the one per-op column that is not linear in the batch).
        r8 = trace(8)
        if [r.name for r in r8] == [r.name for r in r1]:
            a1.tensor_core = a1.tensor_core | op_arrays(r8).tensor_core
    f1 = (a2.flops - a1.flops) / (b2 - b1)
    by1 = (a2.bytes - a1.bytes) / (b2 - b1)
    a1.flops_per_sample, a1.bytes_per_sample = f1, by1
    a1.flops = a1.flops - f1 * b1
    a1.bytes = a1.bytes - by1 * b1
    assert a1.relayout_bytes is not None and a2.relayout_bytes is not None
    act1 = (a2.relayout_bytes - a1.relayout_bytes) / (b2 - b1)
    a1.relayout_bytes_per_sample, a1.relayout_bytes = act1, a1.relayout_bytes - act1 * b1
    if a1.conv_batch is not None and a2.conv_batch is not None:  # Note [bf16 convolutions before Ampere]
        n1 = (a2.conv_batch - a1.conv_batch) / (b2 - b1)
        a1.conv_batch_per_sample, a1.conv_batch = n1, a1.conv_batch - n1 * b1
    return a1


def _phase_mask(ops: OpArrays, phase: str) -> np.ndarray:
    if phase in ("forward", "inference"):  # an inference trace is all forward (Note [Inference forward])
        return ops.phase == 0
    if phase == "backward":
        return ops.phase >= 1
    if phase == "backward_only":
        return ops.phase == 1
    if phase == "optimizer":
        return ops.phase == 2
    raise UnknownNameError("phase", phase, PREDICT_PHASES)


def _subset(ops: OpArrays, mask: np.ndarray) -> OpArrays:
    return ops.pick(np.flatnonzero(mask))


def _phase_kernels(spec: GPUSpec, model: str, phase: str, batch_sizes: Sequence[float], dtype: str,
                   params: CostParams, use_per_gpu: bool, memory_format: str) -> tuple[OpArrays, torch.Tensor]:
    """Return one phase's kernel ops (views folded) and their kernel seconds at each batch size (batch x ops)."""
    if phase == "inference":  # Note [Inference forward] in gpemu.workloads.optrace
        from gpemu.workloads.optrace import INFERENCE

        all_ops = batch_linear_ops(model, dtype, INFERENCE, memory_format)
    else:
        all_ops = batch_linear_ops(model, dtype, memory_format=memory_format)
    ops = compress_views(_subset(all_ops, _phase_mask(all_ops, phase)))
    cols = spec_columns(ops, spec, params.tc_eff_for(spec), params.m_stream)
    p, f = params.shared, params.factors(spec, use_per_gpu)
    batches = np.asarray(batch_sizes, dtype=np.float64)[:, None]
    assert ops.flops_per_sample is not None and ops.bytes_per_sample is not None
    flops = ops.flops[None, :] + ops.flops_per_sample[None, :] * batches
    nbytes = ops.bytes[None, :] + ops.bytes_per_sample[None, :] * batches
    act = ops.relayout_at_batch(batches)
    with torch.no_grad():
        return ops, kernel_seconds(flops, nbytes, cols, p, f, act, ops.conv_batch_at(batches))


def model_phase_seconds(spec: GPUSpec, model: str, phase: str, batch_sizes: Sequence[float], dtype: str = "fp32",
                        params: CostParams | None = None, use_per_gpu: bool = True,
                        memory_format: str = "nchw") -> np.ndarray:
    """Return the time model's seconds for one phase at each batch size (no profile involved)."""
    params = params or load_params()
    ops, kern = _phase_kernels(spec, model, phase, batch_sizes, dtype, params, use_per_gpu, memory_format)
    p, f = params.shared, params.factors(spec, use_per_gpu)
    with torch.no_grad():
        out = phase_seconds(kern, host_seconds(ops, p, f), p, "forward" if phase == "inference" else phase)
    return out.numpy()


def phase_op_seconds(gpu: GPUSpec | str, model: str, phase: str, batch_size: int, dtype: str = "fp32",
                     params: CostParams | None = None, memory_format: str = "nchw") -> tuple[np.ndarray, list[str]]:
    """Return the time model's kernel seconds of each op of one phase (launch order, views folded away) and the
    ops' cost categories: the per-op prices model_phase_seconds sums, one batch size."""
    params = params or load_params()
    ops, kern = _phase_kernels(get_gpu(gpu), model, phase, [batch_size], dtype, params, True, memory_format)
    return kern[0].numpy(), list(ops.category)


def predict_ops(gpu: GPUSpec | str, ops: Sequence[Any], params: CostParams | None = None) -> list[float]:
    """Return each op's predicted GPU kernel seconds (OpRecord-like objects with name, phase, category, flops,
    bytes, dtype, tensor_core; views get 0). Host dispatch time is not included: the device timeline adds launches."""
    spec = get_gpu(gpu)
    params = params or load_params()
    if not ops:
        return []
    arrays = op_arrays(ops)
    cols = spec_columns(arrays, spec, params.tc_eff_for(spec), params.m_stream)
    with torch.no_grad():
        kern = kernel_seconds(arrays.flops, arrays.bytes, cols, params.shared, params.factors(spec), arrays.relayout_bytes,
                              arrays.conv_batch)
    return [float(x) for x in kern]


# -- the prediction ladder -----------------------------------------------------------------------------------------
def _db_rows(db: Any) -> Any:
    rows = getattr(db, "rows", db)
    return rows if hasattr(rows, "columns") else None


def _profile_estimate(db: Any, spec: GPUSpec, workload: str, phase: str, batch_size: int, dtype: str) -> Estimate | None:
    lookup = getattr(db, "lookup", None)
    if lookup is None:
        return None
    try:
        with warnings.catch_warnings():  # an extrapolated row is discarded below, so its warning is noise here
            warnings.simplefilter("ignore")
            est = lookup(spec.key, workload, phase, batch_size, dtype)
    except GpemuError:
        return None
    if est.kind in ("measured", "interpolated"):
        return est  # type: ignore[no-any-return]
    return None


def _measured_on(rows: Any, workload: str, phase: str, batch_size: int, dtype: str) -> dict[str, float]:
    """Return {gpu key: measured seconds} for an exact (workload, phase, batch, dtype) key."""
    sel = rows[(rows["workload"] == workload) & (rows["phase"] == phase) & (rows["batch_size"] == batch_size)
               & (rows["dtype"] == dtype) & (rows["measured"].astype(int) == 1)]
    out: dict[str, float] = {}
    for gpu, value in zip(sel["gpu"], sel["value"], strict=True):
        try:
            out[get_gpu(str(gpu)).key] = float(value)
        except GpemuError:
            continue
    return out


def _measured_series(rows: Any, gpu_key: str, workload: str, phase: str, dtype: str) -> dict[int, float]:
    """Return {batch size: measured seconds} of one GPU's (workload, phase, dtype) rows."""
    sel = rows[(rows["workload"] == workload) & (rows["phase"] == phase) & (rows["dtype"] == dtype)
               & (rows["measured"].astype(int) == 1)]
    out: dict[int, float] = {}
    for gpu, batch, value in zip(sel["gpu"], sel["batch_size"], sel["value"], strict=True):
        try:
            if get_gpu(str(gpu)).key == gpu_key:
                out[int(batch)] = float(value)
        except GpemuError:
            continue
    return out


# Note [Between the source's measured batch sizes]
# A source GPU measured at a few batch sizes only (the H200's shipped profile: 1, 16, 64, 256; a user's `gpemu
# profile` sweep) scaled Y at exactly those sizes and fell to the spec model in between, so one model's prediction
# jumped between two paths along the batch axis: an A100's torchvision swin_t backward read 31.3 / 29.4 / 76.2 / 68.4 /
# 114.2 ms at batch 1 / 8 / 16 / 32 / 64 (batch 32 faster than 16; found running microsoft/Swin-Transformer, session
# 15). X's measured time over its own model time, r_X(B) = measured_X(B) / model_X(B), is what the scaled path carries
# over (value = r_X(B) x model_Y(B)); between two measured sizes lo < B < hi it is now interpolated linearly in
# log r against log B and applied to model_Y(B) (path "scaled-from:<X>", details `interpolated_between`). Outside X's
# measured range (beyond its memory, Note [Nearest source or the spec model]) the spec model stays. GPEmu's five GPUs
# are measured at every batch size from 1 to 256; bench/predict_validation.py thins each held-out GPU's nearest source
# to batch 1, 16, 64, 256 and predicts the rows between: fwd+bwd 6.9 / 19.3 % (median / p90) interpolated, 13.6 /
# 29.0 % from the spec model, 6.0 / 18.0 % had the source measured that batch (21,835 rows).
# Note [Own rows between measured batches]
# A channels_last or inference phase is never Y's own measured row (profiles are NCHW training steps) but Y's row is
# its best source: scaled by model(Y, NHWC or inference) / model(Y, NCHW forward). That held at a measured batch
# only; between two, the source became the nearest *other* GPU, so an emulated H100 running timm's resnet50 in
# channels_last at batch 128 (the H100 measured 64 and 256) was scaled from the H200's rows (session 16, against
# the real H100: -13.4 % iteration). Y's own ratio measured / model, interpolated as in Note [Between the source's
# measured batch sizes], now comes first; outside Y's measured range the other sources answer as before.
def _interpolated_ratio(series: dict[int, float], batch_size: int, model_at: Any) -> tuple[float, int, int] | None:
    """Return (r, lo, hi): the source's measured / model ratio interpolated in log-log at `batch_size` between its
    nearest measured batch sizes lo < batch_size < hi (lo = hi = batch_size where it was measured), or None when the
    batch is outside its measured range."""
    if batch_size in series:
        return series[batch_size] / model_at(batch_size), batch_size, batch_size
    below = [b for b in series if b < batch_size]
    above = [b for b in series if b > batch_size]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    r_lo, r_hi = series[lo] / model_at(lo), series[hi] / model_at(hi)
    w = (np.log(batch_size) - np.log(lo)) / (np.log(hi) - np.log(lo))
    return float(np.exp((1 - w) * np.log(r_lo) + w * np.log(r_hi))), lo, hi


def _measured_gpus(rows: Any, workload: str, phase: str, dtype: str) -> set[str]:
    """Return the catalog keys of GPUs with a measured row of (workload, phase, dtype) at any batch size."""
    sel = rows[(rows["workload"] == workload) & (rows["phase"] == phase) & (rows["dtype"] == dtype)
               & (rows["measured"].astype(int) == 1)]
    out: set[str] = set()
    for gpu in sel["gpu"].unique():
        try:
            out.add(get_gpu(str(gpu)).key)
        except GpemuError:
            continue
    return out


# Note [Nearest source or the spec model]
# The scaled path takes the nearest GPU that measured this workload and phase at all (Note [Choosing the source
# GPU]). When that GPU has no row at this batch size (it ran out of memory there, or was not measured at it), the
# prediction is the spec model with the nearest fitted GPU's factors, not a scaling from the next GPU that has the
# row: that one is of another SM generation, a poorer proxy than the spec model. On GPEmu's five GPUs
# (bench/predict_validation.py, leave-one-GPU-out, fwd+bwd, session 5) 823 P100 pairs lie beyond the 12 GB M40's
# batch range; scaled from the V100 they were 16.1 / 34.5 % off (median / p90), from the spec model 8.5 / 25.1 %.
# The P100 went from 8.5 / 25.8 % to 7.3 / 21.7 %, all five from 8.3 / 20.1 % (28,385 pairs) to 8.2 / 19.8 %
# (all 28,915 pairs: the 530 V100 rows above the RTX 6000's 24 GB had no scaled prediction before).


# Note [Borrowed factors]
# A GPU without fitted per-GPU factors (a, b, c) borrows those of the nearest fitted GPU (Note [Choosing the source
# GPU] in similarity.py) rather than the fleet average 1.0: on the spec-model path that took the leave-one-GPU-out
# error from 24.0 / 56.2 % (median / p90) to 15.6 / 41.8 % (V100 29.4 -> 11.6 %, RTX 6000 34.2 -> 14.1 % median).
# Scaling Y from a measured X uses X's factors on both sides when Y has none of its own, so the ratio
# model(Y)/model(X) is the spec ratio at X's efficiencies: X's peculiarities (its host CPU, its achieved bandwidth)
# carry over instead of being replaced by another GPU's on Y's side only.
# The host factor c is not borrowed: it describes the CPU, driver and torch build of the machine that measured X, not
# X's GPU, so an unmeasured Y gets the fleet-average host (c = 1.0; the fit's prior centres the c's on 1). On the
# leave-one-GPU-out bench (2026-11-23, session 2's fold fits) this moved the host-bound small batches of a held-out GPU to the
# measurement (V100 <- RTX 6000, batch 1-2: +17.9 -> +15.0 % signed; M40 <- P100: -13.9 -> -11.5 %).
def borrow_factors(params: CostParams, gpu_key: str, from_key: str) -> CostParams:
    """Return params where `gpu_key` uses the device factors (a, b) fitted for `from_key` and the average host."""
    borrowed = {k: v for k, v in params.per_gpu.get(from_key, {}).items() if k in BORROWED_PARAMS}
    return replace(params, per_gpu={**params.per_gpu, gpu_key: borrowed})


# Note [A sibling dtype on the same GPU]
# A GPU that measured a model in fp16 AMP but is asked for bf16 AMP (or pure fp16 for pure bf16, and back) has a
# better source than any other GPU: the same card, the same kernels' shapes, tensor cores of the same rate from
# Ampere on. Such a phase is its own measured sibling row scaled by model(dtype) / model(sibling) (path
# "scaled-from-dtype:<sibling>"; before Ampere the model ratio carries bf16's missing tensor cores), ahead of the
# nearest other GPU. Session 12's timm ViT-B/16 in bf16 on an emulated H200 (measured rows: fp16 AMP) was priced by
# the spec model at 41.7 ms a step where the card's fp16 AMP row says 34.3 ms, and the unmodified script ran 37.1 ms
# (bench/data/h200-2026-11-27/dropin-real). `gpemu predict` shows the cross-GPU path's expected error for it.
DTYPE_SIBLINGS: dict[str, tuple[str, ...]] = {"amp_bf16": ("amp",), "amp": ("amp_bf16",), "bf16": ("fp16",),
                                              "tf32": ("fp32",), "fp32": ("tf32",),
                                              "fp16": ("bf16",)}


# Note [A sibling dtype on another GPU]
# When no GPU measured the asked dtype but one measured its sibling (DTYPE_SIBLINGS: bf16 AMP / fp16 AMP, bf16 / fp16,
# TF32 GEMMs / torch's default fp32), the nearest of those is the source, its row scaled by model(Y, dtype) /
# model(X, sibling): the model carries both the GPU and the dtype change, as it does for each alone (Note [A sibling
# dtype on the same GPU], the scaled path). Before, such a phase fell to the spec model, so one GPU read two paths for
# one model: an emulated A100's resnet18 training step at batch 8 took 14.6 ms of GPU in fp32 (scaled from the H200's
# measured rows, host-bound on the H200 lease's host) and 8.0 ms with `torch.set_float32_matmul_precision("high")`
# (spec model), although the flag moves only the classifier GEMM (tests/torch_backend/test_fp32_modes.py). The
# source names both dtypes, details carry `from_dtype`.
def _dtype_note(src_dtype: str, dtype: str) -> str:
    """Return ', <src_dtype>' for a source row of a sibling dtype, else ''."""
    return f", {src_dtype}" if src_dtype != dtype else ""


def predict_phase(gpu: GPUSpec | str, workload: str, phase: str, batch_size: int, dtype: str = "fp32",
                  db: Any | None = None, params: CostParams | None = None,
                  exclude_gpus: Sequence[str] = (), memory_format: str = "nchw") -> Estimate:
    """Return seconds for one phase: (a) the db's measured/interpolated row, (a') the same GPU's row in a sibling
    dtype scaled by the model's dtype ratio (Note [A sibling dtype on the same GPU]), (b) the nearest measured GPU X
    (Note [Choosing the source GPU]) scaled by model(Y)/model(X) (path "scaled-from:<X>"), or (c) the time model from the
    spec (path "spec-model"). memory_format="channels_last" prices an NHWC model (Note [Layout cost]); measured
    rows are NCHW, so they are then only sources: scaled by model(Y, NHWC) / model(X, NCHW), X may be Y itself."""
    spec = get_gpu(gpu)
    if phase not in PREDICT_PHASES:
        raise UnknownNameError("phase", phase, PREDICT_PHASES)
    if batch_size < 1:
        raise GpemuError(f"batch size must be >= 1, got {batch_size}")
    if memory_format not in MEMORY_FORMATS:
        raise GpemuError(f"unknown memory format {memory_format!r}: use one of {', '.join(MEMORY_FORMATS)}")
    nchw = memory_format == "nchw"
    # measured rows are NCHW training forwards / backwards: for NHWC or an inference forward they are only sources,
    # scaled by the model's ratio, and Y's own row is one of them (Note [Inference forward] in workloads/optrace.py)
    src_phase = "forward" if phase == "inference" else phase
    own_row_is_answer = nchw and phase != "inference"
    if db is not None and spec.key not in exclude_gpus and own_row_is_answer:
        hit = _profile_estimate(db, spec, workload, phase, batch_size, dtype)
        if hit is not None:
            return hit
    params = params or load_params()
    own = float(model_phase_seconds(spec, workload, phase, [batch_size], dtype, params,
                                    memory_format=memory_format)[0])
    rows = _db_rows(db) if db is not None else None
    if rows is not None and src_phase in ("forward", "backward") and spec.key not in exclude_gpus:
        for sibling in DTYPE_SIBLINGS.get(dtype, ()):  # See Note [A sibling dtype on the same GPU]
            sib = _measured_on(rows, workload, src_phase, batch_size, sibling).get(spec.key)
            if sib is None:
                continue
            sib_model = float(model_phase_seconds(spec, workload, src_phase, [batch_size], sibling, params)[0])
            return Estimate(sib * own / sib_model, "s", "predicted", source=f"{spec.key} measured {sib:.6g} s "
                            f"({src_phase}, {sibling}) x model ratio {dtype} / {sibling} {own / sib_model:.4g}",
                            path=f"scaled-from-dtype:{sibling}",
                            details={"from_dtype": sibling, "measured_s": sib, "model_y_s": own,
                                     "model_x_s": sib_model, "memory_format": memory_format,
                                     "source_phase": src_phase})
    if rows is not None and src_phase in ("forward", "backward"):
        src_dtype = dtype  # See Note [A sibling dtype on another GPU]
        sources = {k for k in _measured_gpus(rows, workload, src_phase, dtype)
                   if k != spec.key and k not in exclude_gpus}
        for sibling in () if sources else DTYPE_SIBLINGS.get(dtype, ()):
            sources = {k for k in _measured_gpus(rows, workload, src_phase, sibling)
                       if k != spec.key and k not in exclude_gpus}
            if sources:
                src_dtype = sibling
                break
        measured = {k: v for k, v in _measured_on(rows, workload, src_phase, batch_size, src_dtype).items()
                    if (k != spec.key or not own_row_is_answer) and k not in exclude_gpus}
        # own NCHW row: channels_last; else the nearest GPU that measured this workload, if it has this batch size
        x_key = spec.key if spec.key in measured else nearest(spec, sources)  # Note [Nearest source or the spec model]

        def own_scaled_from(source: str) -> float:
            """Y's model seconds as the ratio's numerator: with the source's factors when Y has none of its own
            (Note [Borrowed factors])."""
            if spec.key in params.per_gpu:
                return own
            return float(model_phase_seconds(spec, workload, phase, [batch_size], dtype,
                                             borrow_factors(params, spec.key, source),
                                             memory_format=memory_format)[0])

        def between(x_key: str, x_dtype: str, note: str, numerator: Callable[[], float]) -> Estimate | None:
            """X's measured / model ratio interpolated between its measured batch sizes, times Y's model seconds
            (Note [Between the source's measured batch sizes]); None outside X's measured range."""
            x_spec = get_gpu(x_key)
            hit_r = _interpolated_ratio(_measured_series(rows, x_key, workload, src_phase, x_dtype), batch_size,
                                        lambda b: float(model_phase_seconds(x_spec, workload, src_phase, [b], x_dtype,
                                                                            params)[0]))
            if hit_r is None:
                return None
            ratio, lo, hi = hit_r
            y_s = numerator()
            return Estimate(ratio * y_s, "s", "predicted", source=f"{x_key} measured / model ratio {ratio:.4g} "
                            f"({src_phase}{note}, interpolated between batch {lo} and {hi}) x model {y_s:.6g} s",
                            path=f"scaled-from:{x_key}",
                            details={"from_gpu": x_key, "ratio": ratio, "model_y_s": y_s,
                                     "interpolated_between": [lo, hi], "memory_format": memory_format,
                                     "source_phase": src_phase, "from_dtype": x_dtype})

        if not own_row_is_answer and spec.key not in exclude_gpus and spec.key not in measured:
            own_s = own
            hit = between(spec.key, dtype, ", NCHW", lambda: own_s)  # See Note [Own rows between measured batches]
            if hit is not None:
                return hit
        if x_key is not None and x_key in measured:
            x_spec = get_gpu(x_key)
            x_model = float(model_phase_seconds(x_spec, workload, src_phase, [batch_size], src_dtype, params)[0])
            own = own_scaled_from(x_key)
            value = measured[x_key] * own / x_model
            return Estimate(value, "s", "predicted", source=f"{x_key} measured {measured[x_key]:.6g} s "
                            f"({src_phase}{_dtype_note(src_dtype, dtype)}) x model ratio {own / x_model:.4g}",
                            path=f"scaled-from:{x_key}",
                            details={"from_gpu": x_key, "measured_s": measured[x_key], "model_y_s": own,
                                     "model_x_s": x_model, "memory_format": memory_format,
                                     "source_phase": src_phase, "from_dtype": src_dtype})
        if x_key is not None and x_key != spec.key:  # See Note [Between the source's measured batch sizes]
            source_key = x_key
            hit = between(x_key, src_dtype, _dtype_note(src_dtype, dtype), lambda: own_scaled_from(source_key))
            if hit is not None:
                return hit
    factor_source = params.factor_source(spec)
    factors = ("its own fitted factors" if factor_source == spec.key else
               f"factors of {factor_source} (nearest fitted GPU)" if factor_source else "no per-GPU factors")
    return Estimate(own, "s", "predicted", source=f"gpemu.cost time model, {factors} "
                    f"({params.note or 'fitted.json'})", path="spec-model",
                    details={"model_s": own, "factors_from": factor_source, "memory_format": memory_format})


def catalog_keys() -> list[str]:
    """Return the catalog keys of every GPU (for 'predict every GPU' loops)."""
    return [s.key for s in list_gpus()]
