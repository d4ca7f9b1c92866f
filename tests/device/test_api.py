"""The explicit Emulator API: copies overlap compute, pageable copies block the host, phases come from profiles."""

from __future__ import annotations

import pytest

from gpemu.device import ManualClock
from gpemu.device.api import Emulator, estimate_phase
from gpemu.errors import GpemuError
from gpemu.estimate import Estimate, missing
from gpemu.hardware import get_gpu

MB = 10**6


class StubDB:
    """A profile DB stand-in: measured rows for one (workload, phase, batch) each, missing otherwise."""

    def __init__(self, rows: dict[tuple[str, str, int], float]) -> None:
        self.rows = rows
        self.calls: list[tuple[str, str, str, int, str]] = []

    def lookup(self, gpu: str, workload: str, phase: str, batch_size: int, dtype: str = "fp32", warn: bool = True) -> Estimate:
        self.calls.append((gpu, workload, phase, batch_size, dtype))
        value = self.rows.get((workload, phase, batch_size))
        if value is None:
            return missing("s", f"no row for {workload} {phase} b{batch_size}")
        return Estimate(value, "s", "measured", source="stub")


@pytest.fixture
def emu() -> Emulator:
    db = StubDB({("resnet50", "forward", 128): 0.1193, ("resnet50", "backward", 128): 0.2655})
    return Emulator("v100", clock=ManualClock(), db=db)


def test_pinned_async_h2d_overlaps_compute_on_another_stream(emu: Emulator) -> None:
    copy_stream = emu.stream()
    k = emu.compute(0.050, "kernel")
    c = emu.h2d(115 * MB, pinned=True, non_blocking=True, stream=copy_stream)
    # V100 pinned H2D is 11.5 GB/s in the catalog: 115e6 / 11.5e9 = 0.010 s, starting at once on the copy engine.
    assert c.start_s == 0.0
    assert c.duration_s == pytest.approx(0.010)
    assert emu.now() == 0.0  # the host did not wait
    assert c.end_s < k.end_s
    emu.synchronize()
    assert emu.now() == pytest.approx(5e-6 + 0.050)  # launch latency + kernel; the copy was hidden


def test_h2d_on_the_compute_stream_is_ordered_after_compute(emu: Emulator) -> None:
    k = emu.compute(0.050, "kernel")
    c = emu.h2d(115 * MB)  # default stream: in-order with the kernel, as torch's .cuda(non_blocking=True) is
    assert c.start_s == pytest.approx(k.end_s)
    assert emu.now() == 0.0


def test_pageable_h2d_blocks_the_host_for_stream_and_copy(emu: Emulator) -> None:
    emu.compute(0.020, "kernel")
    c = emu.h2d(43 * MB, pinned=False)
    # cudaMemcpy semantics: wait for the stream (5 us + 20 ms), then copy 43e6 B at 4.3 GB/s = 10 ms.
    assert c.start_s == pytest.approx(0.020005)
    assert c.duration_s == pytest.approx(0.010)
    assert emu.now() == pytest.approx(0.030005)
    assert emu.devices[0].stats.h2d_bytes == 43 * MB


def test_pinned_blocking_copy_waits_but_is_faster_than_pageable(emu: Emulator) -> None:
    emu.h2d(115 * MB, pinned=True, non_blocking=False)
    assert emu.now() == pytest.approx(0.010)  # 115e6 / 11.5e9


def test_run_phase_uses_profile_and_carries_its_source(emu: Emulator) -> None:
    fwd = emu.run_phase("resnet50", "forward", 128)
    bwd = emu.run_phase("resnet50", "backward", 128)
    assert fwd.duration_s == pytest.approx(0.1193)
    assert bwd.start_s == pytest.approx(fwd.end_s)
    assert fwd.args["kind"] == "measured" and fwd.args["source"] == "stub"
    emu.synchronize()
    assert emu.now() == pytest.approx(5e-6 + 0.1193 + 0.2655)  # 0.384805
    # Estimates are cached per (workload, phase, batch, dtype): a second step does not look up again.
    n_calls = len(emu.db.calls)
    emu.train_step("resnet50", 128)
    assert len(emu.db.calls) == n_calls


def test_run_phase_rejects_bad_batch(emu: Emulator) -> None:
    with pytest.raises(GpemuError, match="positive integer"):
        emu.run_phase("resnet50", "forward", 0)


def test_missing_profile_and_model_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gpemu.cost.predict", None)  # simulate: no cost model installed
    with pytest.raises(GpemuError, match=r"no time for resnet50 forward at batch 7.*cost model"):
        estimate_phase(get_gpu("v100"), "resnet50", "forward", 7, "fp32", StubDB({}))


def test_events_and_cross_stream_wait(emu: Emulator) -> None:
    side = emu.stream()
    emu.compute(0.010, "producer")
    ev = emu.record_event()
    emu.wait_event(ev, stream=side)
    consumer = emu.compute(0.001, "consumer", stream=side)
    # start = max(now + 5 us launch latency, event at 5 us + 10 ms, compute engine free at 10.005 ms) = 10.005 ms
    assert consumer.start_s == pytest.approx(0.010005)
    start = emu.record_event()
    emu.compute(0.025, "timed")
    end = emu.record_event()
    # start marks the default stream's tail (10.005 ms); the shared compute engine is busy with the consumer until
    # 11.005 ms, so the timed kernel runs 11.005-36.005 ms: end - start = 1 ms + 25 ms = 26 ms.
    assert start.elapsed_time(end) == pytest.approx(26.0)


def test_two_devices_have_independent_engines() -> None:
    emu = Emulator("a100", count=2, clock=ManualClock())
    a = emu.compute(0.010)
    with emu.use_device(1) as dev:
        b = emu.compute(0.010)
        assert dev.index == 1
    assert b.start_s == a.start_s  # both start after their own launch latency
    assert emu.synchronize() == pytest.approx(0.010 + get_gpu("a100").launch_overhead_us * 1e-6)


def test_trace_is_written_on_close(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    path = tmp_path / "t.json"
    with Emulator("v100", clock=ManualClock(), trace_path=path) as emu:
        emu.compute(0.001, "k")
        emu.h2d(MB, pinned=False)
    events = json.loads(path.read_text())["traceEvents"]
    names = [e["name"] for e in events]
    assert "k" in names and any(n.startswith("H2D") for n in names)
