"""Clocks: the real precise clock (hybrid sleep) and a manual clock for deterministic tests."""

from __future__ import annotations

import os
import time
from typing import Protocol

# See Note [Hybrid sleep]: time.sleep() on Linux overshoots by ~50-100 us (timer slack + scheduler wake-up), so we
# sleep to (deadline - margin) and then yield-spin with sleep(0) until the deadline. The spin gives the core away on
# every iteration, so the real data pipeline (DataLoader workers) keeps its CPUs while the host "waits for the GPU".
DEFAULT_SPIN_MARGIN_S = float(os.environ.get("GPEMU_SPIN_MARGIN_US", "200")) * 1e-6


class Clock(Protocol):
    """What the timeline needs from a clock: the time now and a way to wait for a deadline."""

    def now(self) -> float:
        """Return the current time in seconds."""
        ...

    def sleep_until(self, deadline_s: float) -> None:
        """Block the calling thread until `now() >= deadline_s`."""
        ...


class RealClock:
    """Wall-clock time from `time.perf_counter`, with the hybrid sleep-then-spin wait."""

    def __init__(self, spin_margin_s: float = DEFAULT_SPIN_MARGIN_S) -> None:
        self.spin_margin_s = spin_margin_s

    def now(self) -> float:
        """Return `time.perf_counter()`."""
        return time.perf_counter()

    def sleep_until(self, deadline_s: float) -> None:
        """Sleep until `deadline_s - margin`, then yield-spin to the deadline."""
        remaining = deadline_s - time.perf_counter()
        if remaining > self.spin_margin_s:
            time.sleep(remaining - self.spin_margin_s)
        while time.perf_counter() < deadline_s:
            time.sleep(0)


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
