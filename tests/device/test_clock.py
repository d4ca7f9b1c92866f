"""RealClock precision (loose bounds for a loaded CI machine) and ManualClock semantics."""

from __future__ import annotations

import statistics
import time

import pytest

from gpemu.device.clock import ManualClock, RealClock


def test_real_clock_never_returns_early_and_is_precise_at_1ms() -> None:
    clock = RealClock()
    medians_s = []
    for _attempt in range(3):  # best of 3 rounds: a round the shared host preempts us through is not the clock
        errors_s = []
        for _ in range(40):
            deadline = clock.now() + 1e-3
            clock.sleep_until(deadline)
            end = time.perf_counter()
            assert end >= deadline  # never early, in every round
            errors_s.append(end - deadline)
        medians_s.append(statistics.median(errors_s))
        if medians_s[-1] < 200e-6:
            break
    # Loose CI bound: median error of 1 ms waits under 200 us (bench/clock_precision.py measures ~1-2 us idle).
    assert min(medians_s) < 200e-6


def test_past_deadline_returns_at_once() -> None:
    clock = RealClock()
    t0 = time.perf_counter()
    clock.sleep_until(t0 - 1.0)
    assert time.perf_counter() - t0 < 5e-3


def test_margin_grows_with_the_wait_and_is_capped() -> None:
    clock = RealClock(spin_margin_s=150e-6, max_spin_margin_s=400e-6, spin_fraction=0.05)
    assert clock.margin_s(1e-3) == pytest.approx(200e-6)  # 150 us + 5% of 1 ms
    assert clock.margin_s(1.0) == pytest.approx(400e-6)  # 150 us + 50 ms, capped at 400 us


def test_manual_clock_only_moves_forward() -> None:
    clock = ManualClock(1.0)
    clock.sleep_until(0.5)
    assert clock.now() == 1.0
    clock.advance(0.25)
    clock.sleep_until(2.0)
    assert clock.now() == 2.0
