"""Tests for EmulatedGPU's listener API (what the run report and future multi-process observers attach to)."""

from __future__ import annotations

from typing import Any

import pytest

from gpemu.device import EmulatedGPU, ManualClock


class _Log:
    def __init__(self) -> None:
        self.work: list[tuple[str, float, float]] = []
        self.waits: list[tuple[float, float, str]] = []

    def on_work(self, work: Any) -> None:
        self.work.append((work.name, work.start_s, work.end_s))

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        self.waits.append((start_s, end_s, reason))


def test_listener_sees_work_and_waits_until_removed() -> None:
    gpu = EmulatedGPU("v100", clock=ManualClock())
    log = _Log()
    remove = gpu.add_listener(log)
    launch_s = gpu.spec.launch_overhead_us * 1e-6  # 5 us on the V100 (gpus.toml)
    gpu.default_stream.enqueue(0.010, "k1")
    gpu.default_stream.enqueue(0.020, "k2")
    gpu.synchronize()
    # k1 starts after one launch overhead and runs 10 ms; k2 starts when k1 ends (same stream) and runs 20 ms
    assert log.work == [("k1", pytest.approx(launch_s), pytest.approx(launch_s + 0.010)),
                        ("k2", pytest.approx(launch_s + 0.010), pytest.approx(launch_s + 0.030))]
    # the host was at t=0 when it synchronised and waited to the end of k2
    assert log.waits == [(0.0, pytest.approx(launch_s + 0.030), "device synchronize")]
    remove()
    gpu.default_stream.enqueue(0.001, "k3")
    gpu.synchronize()
    assert len(log.work) == 2 and len(log.waits) == 1  # removed: nothing more arrives
