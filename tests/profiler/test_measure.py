"""Tests for gpemu.profiler.measure: spread statistics, phase boundaries, copies and the memory tracker."""

from __future__ import annotations

import math

import pytest
import torch

from gpemu.profiler.measure import COPY_PHASES, TrainingStep, measure_copies, measure_step, spread_of
from gpemu.profiler.target import DryRunTarget, is_oom
from gpemu.profiler.workload import build_workload, loss_of


def test_spread_of_percentiles() -> None:
    s = spread_of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s.n == 5
    assert s.mean == pytest.approx(3.0)
    assert s.std == pytest.approx(math.sqrt(2.5))  # sample variance of 1..5 = 10 / 4
    assert s.p10 == pytest.approx(1.4)  # linear: index 0.1 * 4 = 0.4 -> 1 + 0.4 * (2 - 1)
    assert s.p50 == pytest.approx(3.0)
    assert s.p90 == pytest.approx(4.6)  # index 3.6 -> 4 + 0.6
    assert (s.min, s.max) == (1.0, 5.0)


class _CountingTarget(DryRunTarget):
    """Marks are a synthetic clock: 0, 1, 3, 6, 10, ... (gaps 1, 2, 3, 4 between consecutive marks)."""

    def __init__(self) -> None:
        super().__init__()
        self._t = 0.0
        self._gap = 1.0

    def mark(self) -> float:
        t = self._t
        self._t += self._gap
        self._gap += 1.0
        return t


def test_phase_boundaries_from_marks() -> None:
    step = TrainingStep(_CountingTarget(), build_workload("tiny-cnn", 2), "fp32")
    marks = step.run()
    assert marks == [0.0, 1.0, 3.0, 6.0, 10.0]
    times = step.phase_times_s(marks)
    assert times["forward"] == 1.0  # m1 - m0
    assert times["backward"] == 9.0  # m4 - m1: loss + zero_grad + backward + step (GPEmu)
    assert times["backward_only"] == 3.0  # m3 - m2
    assert times["optimizer"] == 4.0  # m4 - m3


def test_dry_run_memory_tracker_counts_parameters_gradients_momentum() -> None:
    step = TrainingStep(DryRunTarget(), build_workload("tiny-cnn", 1), "fp32")
    result = measure_step(step, warmup=0, reps=1)
    # params: conv 8*3*3*3 + 8 = 224, bn 8 + 8 = 16, linear 128*1000 + 1000 = 129000 -> 129240 * 4 B = 516960 B
    # persistent = params + grads + momentum (3 * 516960) + bn buffers (2 * 8 * 4 + 8 for num_batches_tracked) = 1550952
    assert result.memory_mib["mem_persistent"] * 1024**2 == pytest.approx(3 * 516960 + 72)
    # activations of one sample: conv, bn, relu 8*56*56*4 B each; pool, flatten 8*4*4*4; linear 1000*4
    assert (result.memory_mib["mem_peak"] - result.memory_mib["mem_persistent"]) * 1024**2 == pytest.approx(
        3 * 100352 + 2 * 512 + 4000
    )
    assert len(result.samples["forward"]) == 1


def test_fake_memory_limit_raises_oom() -> None:
    step = TrainingStep(DryRunTarget(memory_limit_mib=1.6), build_workload("tiny-cnn", 1), "fp32")
    with pytest.raises(torch.OutOfMemoryError) as info:
        measure_step(step, warmup=0, reps=1)
    assert is_oom(info.value)
    assert not is_oom(RuntimeError("shape mismatch"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))


def test_copies_cover_every_phase() -> None:
    out = measure_copies(DryRunTarget(), 1 << 16, warmup=1, reps=3)
    assert set(out) == set(COPY_PHASES)
    assert all(len(v) == 3 and min(v) > 0 for v in out.values())


def test_loss_of_token_outputs() -> None:
    logits = torch.zeros(2, 5, 7)  # B x S x V, uniform -> loss = ln 7
    assert loss_of(logits, torch.zeros(2, 5, dtype=torch.long)).item() == pytest.approx(math.log(7))
