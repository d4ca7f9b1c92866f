"""Clocks: the real precise clock (hybrid sleep) and a manual clock for deterministic tests."""

from __future__ import annotations

import os
import time
from typing import Protocol

# Note [Hybrid sleep]
# ~~~~~~~~~~~~~~~~~~~
# time.sleep() on Linux overshoots its target by roughly 50-100 us (the default 50 us timer slack plus the scheduler's
# wake-up latency), and far more on a loaded machine. An emulated GPU wait must end within a few microseconds of its
# deadline or per-iteration times drift. So RealClock.sleep_until sleeps to (deadline - margin) and then yield-spins
# until the deadline. Each spin iteration calls os.sched_yield(), which hands the core to any runnable thread (the
# DataLoader workers need it) instead of burning it; with nothing else runnable it returns at once, which is what
# keeps the error in the microsecond range. bench/clock_precision.py measures the error and the CPU burnt per wait
# for several margins. On this 2-core VM time.sleep overshoots by ~60 us for 100 us sleeps, ~80 us at 1 ms and
# ~150-170 us (tails ~250 us) at 10-100 ms, so the margin grows with the wait: margin = base + 5% of the wait, capped
# (defaults 150 us, 400 us cap; GPEMU_SPIN_MARGIN_US sets the base, GPEMU_SPIN_MARGIN_MAX_US the cap). A 1 ms wait
# spins its last 200 us, a 10 ms or longer wait its last 400 us. An adaptive margin (p95 of recent sleep overshoots
# + 30 us) was tried and rejected: learnt on short waits it was too small for long ones (p99 400 us at 1 ms).
# sleep_until never returns before the deadline: the spin loop's exit test is `now >= deadline`.
DEFAULT_SPIN_MARGIN_S = float(os.environ.get("GPEMU_SPIN_MARGIN_US", "150")) * 1e-6
DEFAULT_SPIN_MARGIN_MAX_S = float(os.environ.get("GPEMU_SPIN_MARGIN_MAX_US", "400")) * 1e-6
SPIN_MARGIN_FRACTION = 0.05

_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


class Clock(Protocol):
    """What the timeline needs from a clock: the time now and a way to wait for a deadline."""

    def now(self) -> float:
        """Return the current time in seconds."""
        ...

    def sleep_until(self, deadline_s: float) -> None:
        """Block the calling thread until `now() >= deadline_s`."""
        ...


class RealClock:
    """Wall-clock time from `time.perf_counter`, with the hybrid sleep-then-spin wait. See Note [Hybrid sleep]."""

    def __init__(
        self,
        spin_margin_s: float = DEFAULT_SPIN_MARGIN_S,
        max_spin_margin_s: float = DEFAULT_SPIN_MARGIN_MAX_S,
        spin_fraction: float = SPIN_MARGIN_FRACTION,
    ) -> None:
        self.spin_margin_s = spin_margin_s
        self.max_spin_margin_s = max(spin_margin_s, max_spin_margin_s)
        self.spin_fraction = spin_fraction

    def margin_s(self, wait_s: float) -> float:
        """Return how long before the deadline a wait of `wait_s` stops sleeping and starts to spin."""
        return min(self.max_spin_margin_s, self.spin_margin_s + self.spin_fraction * max(0.0, wait_s))

    def now(self) -> float:
        """Return `time.perf_counter()`."""
        return time.perf_counter()

    def sleep_until(self, deadline_s: float) -> None:
        """Sleep until `deadline_s - margin`, then yield-spin to the deadline; never returns early."""
        perf_counter = time.perf_counter
        remaining_s = deadline_s - perf_counter()
        sleep_s = remaining_s - self.margin_s(remaining_s)
        if sleep_s > 0:
            time.sleep(sleep_s)
        while perf_counter() < deadline_s:
            _yield()


class ManualClock:
    """A clock that only moves when told to (or when someone waits on it): deterministic timeline tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        """Return the manual time."""
        return self._now

    def advance(self, duration_s: float) -> None:
        """Move time forward by `duration_s` (host work)."""
        self._now += max(0.0, duration_s)

    def sleep_until(self, deadline_s: float) -> None:
        """Jump to the deadline if it is in the future."""
        self._now = max(self._now, deadline_s)
