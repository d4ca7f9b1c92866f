"""Measurement loops: training-step phases, memory, host<->device copies and per-op kernel times."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from gpemu.profiler.target import Target
from gpemu.profiler.workload import Workload, loss_of

# Timed regions of one training step (see Note [Phase boundaries]).
STEP_PHASES: tuple[str, ...] = ("forward", "backward", "backward_only", "optimizer")

# Note [Phase boundaries]
# One training step is timed with five marks m0..m4 on the device stream:
#   m0  model(x)  m1  loss, zero_grad  m2  loss.backward()  m3  optimizer.step()  m4
#   forward       = m0 -> m1  (model forward only, as GPEmu measured it)
#   backward      = m1 -> m4  (GPEmu-compatible: loss + zero_grad + backward + step)
#   backward_only = m2 -> m3  (autograd backward alone; with AMP it includes the scaled-loss backward)
#   optimizer     = m3 -> m4  (SGD momentum step; with fp16 AMP also GradScaler unscale/inf-check/update)
# All five come from the same iterations, so backward >= backward_only + optimizer up to event resolution.


@dataclass(frozen=True)
class Spread:
    """Run-to-run statistics of one phase over the timed repetitions."""

    n: int
    mean: float
    std: float
    min: float
    p10: float
    p50: float
    p90: float
    max: float


def spread_of(values: Sequence[float]) -> Spread:
    """Return mean, std and the 0/10/50/90/100th percentiles (linear interpolation) of `values`."""
    if not values:
        raise ValueError("no samples")
    arr = np.asarray(values, dtype=float)
    p = np.percentile(arr, [0, 10, 50, 90, 100])
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(len(values), float(arr.mean()), std, float(p[0]), float(p[1]), float(p[2]), float(p[3]), float(p[4]))


@dataclass
class DtypeSetup:
    """How a dtype label is applied: parameter/input cast, autocast dtype, loss scaling, TF32 switches."""

    cast: torch.dtype | None = None
    autocast: torch.dtype | None = None
    scaler: bool = False
    tf32: bool | None = None  # None = leave torch defaults


DTYPE_SETUPS: dict[str, DtypeSetup] = {
    "fp32": DtypeSetup(),
    "tf32": DtypeSetup(tf32=True),
    "fp16": DtypeSetup(cast=torch.float16),
    "bf16": DtypeSetup(cast=torch.bfloat16),
    "amp": DtypeSetup(autocast=torch.float16, scaler=True),
    "amp_bf16": DtypeSetup(autocast=torch.bfloat16),
}


@contextlib.contextmanager
def tf32_mode(enabled: bool | None) -> Any:
    """Temporarily set torch's TF32 switches (None = leave them alone)."""
    if enabled is None:
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class TrainingStep:
    """One SGD-momentum training step of a workload on a target, with timing marks at the phase boundaries."""

    def __init__(self, target: Target, workload: Workload, dtype: str, lr: float = 0.01) -> None:
        self.target = target
        self.setup = DTYPE_SETUPS[dtype]
        device = target.device
        self.model = workload.model.to(device)
        if self.setup.cast is not None:
            self.model = self.model.to(self.setup.cast)
        self.model.train()
        inputs = workload.inputs.to(device)
        if self.setup.cast is not None and inputs.is_floating_point():
            inputs = inputs.to(self.setup.cast)
        self.inputs = inputs
        self.targets = workload.targets.to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scaler = target.grad_scaler() if self.setup.scaler else None

    def optimizer_state_bytes(self) -> int:
        """Return the bytes the optimizer will keep (one momentum buffer per parameter)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.setup.autocast is None:
            return contextlib.nullcontext()
        return self.target.autocast(self.setup.autocast)

    def run(self) -> list[Any]:
        """Run one step; return the five marks m0..m4 (see Note [Phase boundaries])."""
        mark = self.target.mark
        m0 = mark()
        with self._autocast():
            output = self.model(self.inputs)
        m1 = mark()
        with self._autocast():
            loss = loss_of(output, self.targets)
        self.optimizer.zero_grad(set_to_none=True)
        m2 = mark()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        m3 = mark()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        m4 = mark()
        return [m0, m1, m2, m3, m4]

    def phase_times_s(self, marks: list[Any]) -> dict[str, float]:
        """Return the phase durations of one step's marks (call after synchronize)."""
        el = self.target.elapsed_s
        m0, m1, m2, m3, m4 = marks
        return {
            "forward": el(m0, m1),
            "backward": el(m1, m4),
            "backward_only": el(m2, m3),
            "optimizer": el(m3, m4),
        }


@dataclass
class StepResult:
    """Phase samples (seconds per repetition) and memory figures (MiB) of one (model, batch, dtype)."""

    samples: dict[str, list[float]]
    memory_mib: dict[str, float]  # mem_peak, mem_persistent, mem_reserved


def measure_step(step: TrainingStep, warmup: int, reps: int) -> StepResult:
    """Return per-phase samples over `reps` timed steps after `warmup` untimed ones, plus peak/persistent memory."""
    target = step.target
    target.watch(step.model, step.optimizer_state_bytes())
    try:
        with tf32_mode(step.setup.tf32):
            for _ in range(warmup):
                step.run()
            target.synchronize()
            target.reset_peak()
            all_marks = [step.run() for _ in range(reps)]
            target.synchronize()
        samples: dict[str, list[float]] = {phase: [] for phase in STEP_PHASES}
        for marks in all_marks:
            for phase, value in step.phase_times_s(marks).items():
                samples[phase].append(value)
        mem = target.memory_mib()
    finally:
        target.unwatch()
    memory = {"mem_peak": mem["peak"], "mem_persistent": mem["allocated"], "mem_reserved": mem["reserved"]}
    return StepResult(samples, memory)


def measure_model_h2d(target: Target, model: nn.Module, reps: int = 3) -> list[float]:
    """Return seconds to copy `model` from pageable host memory to the device, `reps` times."""
    out: list[float] = []
    for _ in range(reps):
        model.to("cpu")
        target.synchronize()
        t0 = time.perf_counter()
        model.to(target.device)
        target.synchronize()
        out.append(time.perf_counter() - t0)
    return out


COPY_PHASES: tuple[str, ...] = ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned")


def measure_copies(target: Target, size_bytes: int, warmup: int, reps: int) -> dict[str, list[float]]:
    """Return per-repetition seconds of one `size_bytes` copy for each of COPY_PHASES."""
    device_buf = torch.empty(size_bytes, dtype=torch.uint8, device=target.device)
    out: dict[str, list[float]] = {}
    for phase in COPY_PHASES:
        pinned = phase.endswith("pinned")
        host = target.host_buffer(size_bytes, pinned)
        if phase.startswith("h2d"):

            def copy(host: torch.Tensor = host, pinned: bool = pinned) -> None:
                device_buf.copy_(host, non_blocking=pinned)
        else:

            def copy(host: torch.Tensor = host, pinned: bool = pinned) -> None:
                host.copy_(device_buf, non_blocking=pinned)

        out[phase] = _time_repeated(target, copy, warmup, reps)
        del host
    return out


def _time_repeated(target: Target, fn: Callable[[], None], warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    target.synchronize()
    marks = []
    for _ in range(reps):
        start = target.mark()
        fn()
        marks.append((start, target.mark()))
    target.synchronize()
    return [target.elapsed_s(a, b) for a, b in marks]


@dataclass(frozen=True)
class OpTime:
    """Kernel time of one aten op with given input shapes, per training step."""

    op: str
    input_shapes: str
    calls_per_step: float
    device_time_us: float  # per call, including child ops
    self_device_time_us: float  # per call, kernels launched by this op itself
    cpu_time_us: float  # per call, host time including children


def profile_ops(target: Target, step: TrainingStep, steps: int = 3) -> list[OpTime]:
    """Return per-(op, input shapes) times of `steps` training steps under torch.profiler (CPU time on a dry run)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if not target.dry_run:
        activities.append(ProfilerActivity.CUDA)
    with tf32_mode(step.setup.tf32):
        step.run()  # warm the autotuner/caches outside the profile
        target.synchronize()
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(steps):
                step.run()
            target.synchronize()
    out: list[OpTime] = []
    for evt in prof.key_averages(group_by_input_shape=True):
        if not evt.key.startswith("aten::") or evt.count == 0:
            continue
        if target.dry_run:  # the CPU is the "device": see Note [Dry-run target]
            device_total, device_self = evt.cpu_time_total, evt.self_cpu_time_total
        else:
            device_total, device_self = evt.device_time_total, evt.self_device_time_total
        out.append(
            OpTime(
                op=evt.key,
                input_shapes=str(evt.input_shapes),
                calls_per_step=evt.count / steps,
                device_time_us=device_total / evt.count,
                self_device_time_us=device_self / evt.count,
                cpu_time_us=evt.cpu_time_total / evt.count,
            )
        )
    out.sort(key=lambda o: -o.self_device_time_us * o.calls_per_step)
    return out
