"""Timeline semantics: launches are asynchronous, one stream serialises, copy engines overlap compute."""

from __future__ import annotations

import pytest

from gpemu.device import EmulatedGPU, Event, ManualClock


@pytest.fixture
def gpu() -> EmulatedGPU:
    return EmulatedGPU("v100", clock=ManualClock())


def test_two_launches_on_one_stream_serialise(gpu: EmulatedGPU) -> None:
    s = gpu.default_stream
    a = s.enqueue(0.010, "a")
    b = s.enqueue(0.020, "b")
    # a starts after the launch latency (5 us on V100); b starts when a ends.
    assert a.start_s == pytest.approx(5e-6)
    assert b.start_s == pytest.approx(a.end_s)
    assert s.t_done == pytest.approx(5e-6 + 0.030)
    # The host did not wait for either launch.
    assert gpu.clock.now() == 0.0


def test_h2d_copy_overlaps_compute(gpu: EmulatedGPU) -> None:
    compute = gpu.default_stream
    copy = gpu.new_stream()
    k = compute.enqueue(0.050, "kernel")
    c = copy.enqueue(0.030, "h2d", engine="h2d", category="h2d")
    assert c.start_s == 0.0  # the copy engine is free: it does not wait for the kernel
    assert c.end_s < k.end_s
    gpu.synchronize()
    assert gpu.clock.now() == pytest.approx(5e-6 + 0.050)  # overlapped, not 0.080


def test_second_h2d_waits_for_the_first(gpu: EmulatedGPU) -> None:
    s1, s2 = gpu.new_stream(), gpu.new_stream()
    c1 = s1.enqueue(0.010, "h2d-1", engine="h2d")
    c2 = s2.enqueue(0.010, "h2d-2", engine="h2d")
    assert c2.start_s == pytest.approx(c1.end_s)


def test_event_elapsed_time_is_in_ms(gpu: EmulatedGPU) -> None:
    s = gpu.default_stream
    start, end = Event(), Event()
    start.record(s)
    s.enqueue(0.025, "k")
    end.record(s)
    assert not end.query()
    # 5 us launch latency + 25 ms kernel = 25.005 ms
    assert start.elapsed_time(end) == pytest.approx(25.005)
    assert end.query()


def test_launch_queue_full_blocks_host() -> None:
    gpu = EmulatedGPU("v100", clock=ManualClock(), launch_queue_depth=4)
    s = gpu.default_stream
    for i in range(4):
        s.enqueue(0.001, f"k{i}")
    assert gpu.clock.now() == 0.0
    s.enqueue(0.001, "k4")  # fifth launch: host waits until the first finishes
    assert gpu.clock.now() == pytest.approx(5e-6 + 0.001)
    assert gpu.stats.host_wait_s["launch queue full"] > 0


def test_stream_wait_event_orders_across_streams(gpu: EmulatedGPU) -> None:
    copy, compute = gpu.new_stream(), gpu.default_stream
    c = copy.enqueue(0.040, "h2d", engine="h2d")
    ev = copy.record_event()
    compute.wait_event(ev)
    k = compute.enqueue(0.010, "k")
    assert k.start_s >= c.end_s


def test_a_multi_launch_item_occupies_that_many_queue_slots() -> None:
    gpu = EmulatedGPU("v100", clock=ManualClock(), launch_queue_depth=4)
    s = gpu.default_stream
    s.enqueue(0.003, "replayed phase", launches=3)  # 3 kernels ending at 1.005, 2.005, 3.005 ms
    assert gpu.clock.now() == 0.0
    s.enqueue(0.003, "next phase", launches=3)  # 3 pending + 3 new > 4 slots: wait until 2 of the first finish
    assert gpu.clock.now() == pytest.approx(5e-6 + 0.002)


def test_more_launches_than_the_queue_holds_block_until_the_tail_fits() -> None:
    gpu = EmulatedGPU("v100", clock=ManualClock(), launch_queue_depth=4)
    work = gpu.default_stream.enqueue(0.008, "big phase", launches=8)
    # The host queues 4 launches, then one more each time one finishes: it returns after 8 - 4 = 4 of the 8 kernels
    # (1 ms each) have finished, at 5 us + 4 ms.
    assert gpu.clock.now() == pytest.approx(work.start_s + 0.004)


def _waits_counter() -> object:
    class Waits:
        def __init__(self) -> None:
            self.count = 0

        def on_work(self, work: object) -> None:
            pass

        def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
            self.count += end_s > start_s

    return Waits()


def _launch(items: list, depth: int, batched: bool) -> tuple[list[tuple[float, float]], float, int]:
    gpu = EmulatedGPU("v100", clock=ManualClock(), launch_queue_depth=depth)
    waits = _waits_counter()
    gpu.add_listener(waits)
    s = gpu.default_stream
    works = s.enqueue_many(items) if batched else [s.enqueue(d, n, category=c, args=a, launches=k)
                                                    for d, n, c, a, k in items]
    return [(w.start_s, w.end_s) for w in works], gpu.clock.now(), waits.count  # type: ignore[attr-defined]


def test_batched_launches_match_one_by_one_launches_with_one_wait() -> None:
    """Note [Batched launches]: the same schedule and host return time as enqueue() item by item, one wait at most."""
    # chunks of 3, 2, 2, 2 kernels of 1 ms each from 5 us on, a queue of 6
    items = [(0.003, "a", "kernel", {}, 3), (0.002, "b", "kernel", {}, 2), (0.002, "c", "kernel", {}, 2),
             (0.002, "d", "kernel", {}, 2)]
    seq, seq_now, seq_waits = _launch(items, 6, batched=False)
    bat, bat_now, bat_waits = _launch(items, 6, batched=True)
    assert [x for w in bat for x in w] == pytest.approx([x for w in seq for x in w])
    # the host goes once 9 - 6 = 3 kernels have finished: 5 us + 3 ms; one by one, chunks c and d each waited
    assert bat_now == pytest.approx(seq_now) == pytest.approx(5e-6 + 0.003)
    assert (seq_waits, bat_waits) == (2, 1)


def test_batched_launches_leave_no_gap_where_a_whole_chunk_waited() -> None:
    """Note [Batched launches]: a chunk as large as the queue waited, one by one, until the queue drained, so the GPU
    idled a launch latency before it; batched, the GPU runs the chunks back to back, as per-kernel launches would."""
    items = [(0.003, "a", "kernel", {}, 3), (0.002, "b", "kernel", {}, 2), (0.004, "c", "kernel", {}, 4)]
    seq, seq_now, _ = _launch(items, 4, batched=False)
    bat, bat_now, _ = _launch(items, 4, batched=True)
    assert seq[2][0] == pytest.approx(5e-6 + 0.005 + 5e-6)  # c after b's end (5.005 ms) plus the 5 us latency
    assert bat[2][0] == pytest.approx(bat[1][1]) == pytest.approx(5e-6 + 0.005)
    assert bat_now == pytest.approx(seq_now) == pytest.approx(5e-6 + 0.005)  # 9 - 4 = 5 kernels finished
