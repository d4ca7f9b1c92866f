"""CUDA graphs on the timeline (Note [CUDA graphs]): capture records, replay places the nodes after one launch."""

from __future__ import annotations

import pytest

from gpemu.device import Event, GraphCaptureError, ManualClock
from gpemu.device.api import Emulator
from gpemu.errors import GpemuError


def _emu() -> Emulator:
    return Emulator("v100", clock=ManualClock())


def test_captured_work_runs_only_on_replay_back_to_back_after_one_launch_latency() -> None:
    emu = _emu()
    dev = emu.devices[0]
    latency_s = dev.spec.launch_overhead_us * 1e-6
    s = emu.stream()
    with emu.capture(s) as graph:
        for _ in range(5):
            emu.compute(0.001, stream=s)  # five 1 ms kernels
    assert dev.busy_s() == 0.0 and s.capture is None  # nothing ran; the stream is released
    assert graph.kernels == 5 and graph.work_s == pytest.approx(0.005)
    emu.clock.advance(0.010)  # host at 10 ms
    works = emu.replay(graph)
    assert len(works) == 1 and works[0].args["kernels"] == 5  # merged into one item
    # starts one launch latency after the call, runs the 5 ms without gaps; the host did not move
    assert works[0].start_s == pytest.approx(0.010 + latency_s)
    assert dev.default_stream.t_done == pytest.approx(0.015 + latency_s)
    assert emu.now() == pytest.approx(0.010)
    emu.replay(graph)  # queued behind the first replay on the same stream
    assert dev.default_stream.t_done == pytest.approx(0.020 + latency_s)
    assert emu.synchronize() == pytest.approx(0.010 + latency_s)


def test_forked_branch_overlaps_on_the_copy_engine_and_joins() -> None:
    emu = _emu()
    dev = emu.devices[0]
    latency_s = dev.spec.launch_overhead_us * 1e-6
    main, side = emu.stream(), emu.stream()
    copy_s = 120e6 / (dev.spec.h2d_pinned_gbps * 1e9)  # a 120 MB pinned copy
    with emu.capture(main) as graph:
        fork = Event()
        fork.record(main)
        side.wait_event(fork)  # side joins the capture
        emu.h2d(120_000_000, pinned=True, non_blocking=True, stream=side)
        emu.compute(0.004, stream=main)
        join = Event()
        join.record(side)
        main.wait_event(join)
        emu.compute(0.001, stream=main)  # after both branches
    assert side.capture is None
    emu.replay(graph)
    # the copy and the 4 ms kernel run side by side, the 1 ms kernel after the longer of them
    assert dev.default_stream.t_done == pytest.approx(latency_s + max(0.004, copy_s) + 0.001)
    assert dev.engines["h2d"].busy_s == pytest.approx(copy_s)


def test_a_host_wait_during_capture_raises_and_relaxed_mode_allows_it() -> None:
    emu = _emu()
    s = emu.stream()
    with pytest.raises(GraphCaptureError, match="operation not permitted when stream is capturing"), \
            emu.capture(s):
        emu.compute(0.001, stream=s)
        emu.synchronize()
    assert not emu.devices[0].captures  # the failed capture ended
    with emu.capture(s, mode="relaxed"):
        emu.synchronize()  # allowed: nothing waits
    with pytest.raises(GpemuError, match="non-default stream"), emu.capture(emu.devices[0].default_stream):
        pass


def test_a_branch_forked_before_later_work_does_not_wait_for_it() -> None:
    """The side stream waits on an event recorded before the 4 ms kernel was issued: on replay its copy starts with
    the graph, not after the kernel (the fork point is the event, not the branch's first appearance)."""
    emu = _emu()
    dev = emu.devices[0]
    latency_s = dev.spec.launch_overhead_us * 1e-6
    main, side = emu.stream(), emu.stream()
    copy_s = 24e6 / (dev.spec.h2d_pinned_gbps * 1e9)  # a 24 MB copy, ~2 ms: shorter than the kernel
    with emu.capture(main) as graph:
        fork = Event()
        fork.record(main)
        emu.compute(0.004, stream=main)
        side.wait_event(fork)
        work = emu.h2d(24_000_000, pinned=True, non_blocking=True, stream=side)
        join = Event()
        join.record(side)
        main.wait_event(join)
    assert work.args["captured"] == graph.graph_id
    works = emu.replay(graph)
    copy = next(w for w in works if w.engine == "h2d")
    assert copy.start_s == pytest.approx(latency_s)  # with the graph, beside the kernel
    assert dev.default_stream.t_done == pytest.approx(latency_s + max(0.004, copy_s))
