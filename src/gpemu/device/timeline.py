"""Engines, streams, events and work items: CUDA's asynchronous execution model as a timeline."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpemu.device.gpu import EmulatedGPU
    from gpemu.device.graph import GraphCapture

EngineName = Literal["compute", "h2d", "d2h"]

# See Note [Launch queue]: CUDA lets the host run ahead of the GPU until a per-stream queue of pending launches is
# full (~1024 entries on current drivers); then the launching thread blocks until a slot frees up.
DEFAULT_LAUNCH_QUEUE_DEPTH = 1024


@dataclass
class Engine:
    """One hardware engine (the SMs, or one copy engine): it runs one work item at a time."""

    name: str
    t_free: float = 0.0
    busy_s: float = 0.0


@dataclass(slots=True)
class Work:
    """One item on the timeline: a kernel, a copy or a phase."""

    name: str
    engine: str
    stream_id: int
    device_index: int
    launch_s: float
    start_s: float
    end_s: float
    category: str = "kernel"
    args: dict[str, object] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """Return end - start in seconds."""
        return self.end_s - self.start_s


_stream_ids = itertools.count(1)


class Stream:
    """An in-order queue of work on one device; launches return at once, the GPU finishes at `t_done`."""

    def __init__(self, device: EmulatedGPU, priority: int = 0, stream_id: int | None = None) -> None:
        self.device = device
        self.priority = priority
        self.stream_id = next(_stream_ids) if stream_id is None else stream_id
        self.t_done = 0.0
        self._pending: deque[float] = deque()  # end times of launched, maybe unfinished work
        self._lock = threading.Lock()
        self.capture: GraphCapture | None = None  # the CUDA graph this stream is capturing into (Note [CUDA graphs])
        self.pool_id = self.stream_id  # the allocator pool of work issued here: the stream's, or a graph's private one

    def __repr__(self) -> str:
        return f"<emulated Stream {self.stream_id} on cuda:{self.device.index} t_done={self.t_done:.6f}>"

    def enqueue(
        self,
        duration_s: float,
        name: str,
        engine: EngineName = "compute",
        category: str = "kernel",
        args: dict[str, object] | None = None,
        launches: int = 1,
    ) -> Work:
        """Launch work of `duration_s` on `engine`; return at once with the scheduled Work (start/end on the timeline).

        `launches` is how many kernel launches the item stands for (a replayed phase stands for all of its kernels):
        they occupy that many launch-queue slots, finishing evenly over the item. See Note [Launch queue].
        """
        if self.capture is not None:  # See Note [CUDA graphs] in graph.py
            return self.capture.add_work(self, duration_s, name, engine, category, args or {}, launches)
        device = self.device
        launches = max(1, launches)
        depth = device.launch_queue_depth
        slots = min(launches, depth)
        # Finished entries only matter once the queue could overflow: skip the check (a clock read) below that.
        # See Note [Host overhead] in gpemu/torch_backend/tensor.py.
        if len(self._pending) + slots > depth:
            self._wait_for_queue_slots(slots)
        with device.lock:
            now = device.clock.now()
            latency_s = device.spec.launch_overhead_us * 1e-6 if engine == "compute" else 0.0
            work = self._place(now + latency_s, device.engines[engine], duration_s, name, engine, category,
                               args or {}, launches, now)
        if launches > depth:
            # The host issued the first `depth` launches, then blocked on each later one until a slot freed: it got
            # back control when the last launch was queued, i.e. once `launches - depth` of them had finished.
            device.host_wait(work.start_s + (work.end_s - work.start_s) * (launches - depth) / launches,
                             reason="launch queue full")
        return work

    def _place(self, earliest_s: float, eng: Engine, duration_s: float, name: str, engine: EngineName, category: str,
               args: dict[str, object], launches: int, host_s: float, queued: bool = True) -> Work:
        """Schedule one item after `earliest_s`, the stream and the engine; record it (caller holds the lock).
        `queued=False`: the item takes no launch-queue slot (a node of a replayed CUDA graph)."""
        start = max(earliest_s, self.t_done, eng.t_free)
        span_s = max(0.0, duration_s)
        end = start + span_s
        self.t_done = end
        eng.t_free = end
        eng.busy_s += end - start
        if queued:
            if launches == 1:
                self._pending.append(end)
            else:
                self._pending.extend([start + span_s * (i + 1) / launches for i in range(launches)])  # list: faster
        work = Work(name, engine, self.stream_id, self.device.index, host_s, start, end, category, args)
        self.device._record(work)
        return work

    # Note [Batched launches]: a replayed call charges its kernels as a few chunks, one work item each (replay.py
    # `_charge_chunks`), issued back to back with no host work between them. Enqueued one by one, each chunk waited
    # for all of its own launch-queue slots: ~8 waits per GPU-bound resnet50 step, each ending in a yield-spin, and a
    # chunk as large as the queue waited until the queue had drained, so the GPU idled a launch latency before it
    # (per-kernel launches would have refilled the queue a slot at a time). enqueue_many issues them all at the
    # current host time and then waits once, until the queue holds at most its depth: where a chunk waited without
    # draining the queue the stream was still busy, so the schedule is the one-by-one one, and the host returns at
    # the same time (the last chunk's wait, pending + its slots <= depth, is pending <= depth after it); where one
    # drained it, the gap is gone. The trace shows the later chunks launched at the call's host time. Effect on
    # bench/host_overhead.py (session 8, quiet 2-core host, default queue): replayed resnet50 steps 1.7-2.2 ->
    # 0.8-1.8 ms of host CPU outside the waits, 3.2-3.7 -> 1.4-2.3 ms in all.
    def enqueue_many(self, items: list[tuple[float, str, str, dict[str, object], int]],
                     engine: EngineName = "compute") -> list[Work]:
        """Launch (duration_s, name, category, args, launches) items back to back, then block the host once until the
        launch queue has room (Note [Batched launches]); return their Works."""
        device = self.device
        if self.capture is not None:  # See Note [CUDA graphs] in graph.py
            return [self.capture.add_work(self, duration_s, name, engine, category, args, launches)
                    for duration_s, name, category, args, launches in items]
        with device.lock:
            now = device.clock.now()
            eng = device.engines[engine]
            earliest_s = now + (device.spec.launch_overhead_us * 1e-6 if engine == "compute" else 0.0)
            works = [self._place(earliest_s, eng, duration_s, name, engine, category, args, max(1, launches), now)
                     for duration_s, name, category, args, launches in items]
        if len(self._pending) > device.launch_queue_depth:
            self._wait_for_queue_slots(0)
        return works

    def _wait_for_queue_slots(self, slots: int = 1) -> None:
        """Block the host until `slots` launch-queue entries are free (CUDA blocks the launching thread)."""
        depth = self.device.launch_queue_depth
        pending = self._pending
        now = self.device.clock.now()
        while pending and pending[0] <= now:
            pending.popleft()
        overflow = len(pending) + slots - depth
        if overflow > 0:
            self.device.host_wait(pending[overflow - 1], reason="launch queue full")
            now = self.device.clock.now()
            while pending and pending[0] <= now:
                pending.popleft()

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait until `event` has completed (no host wait)."""
        if event.capture is not None and event.capture.capturing:  # a fork or join inside a CUDA graph capture
            event.capture.add_wait(self, event.number)
        elif event.t_s is not None and self.capture is None:
            self.t_done = max(self.t_done, event.t_s)

    def wait_stream(self, other: Stream) -> None:
        """Make later work on this stream wait for all work queued so far on `other`."""
        if self.capture is not None or other.capture is not None:  # as torch does it: an event record and wait
            self.wait_event(other.record_event())
            return
        self.t_done = max(self.t_done, other.t_done)

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (or a new one) at the current tail of this stream."""
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """Return True when all queued work has finished."""
        if self.capture is not None:
            self.device.check_not_capturing(f"stream {self.stream_id} query")
        return self.device.clock.now() >= self.t_done

    def synchronize(self) -> None:
        """Block the host until all queued work on this stream has finished."""
        self.device.host_wait(self.t_done, reason=f"stream {self.stream_id} synchronize")


class Event:
    """A marker on a stream: completes when the work before it does; timing in milliseconds like CUDA."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.enable_timing = enable_timing
        self.t_s: float | None = None
        self.device: EmulatedGPU | None = None
        self.capture: GraphCapture | None = None  # recorded inside this CUDA graph capture (Note [CUDA graphs])
        self.number = -1  # its number in that capture

    def record(self, stream: Stream) -> None:
        """Mark the current tail of `stream` (or now, if the stream is idle)."""
        self.device = stream.device
        if stream.capture is not None:  # a node of the graph, not a time
            self.capture = stream.capture
            self.number = stream.capture.add_record(stream)
            self.t_s = None
            return
        self.capture = None
        self.t_s = max(stream.device.clock.now(), stream.t_done)

    def query(self) -> bool:
        """Return True when the event has completed (an unrecorded event counts as completed, as in CUDA)."""
        return self.t_s is None or self.device is None or self.device.clock.now() >= self.t_s

    def synchronize(self) -> None:
        """Block the host until the event has completed."""
        if self.t_s is not None and self.device is not None:
            self.device.host_wait(self.t_s, reason="event synchronize")

    def elapsed_time(self, end: Event) -> float:
        """Return milliseconds from this event to `end` (both must be recorded; waits for `end`, as CUDA requires completion)."""
        if self.t_s is None or end.t_s is None:
            raise RuntimeError("elapsed_time: both events must be recorded before calling elapsed_time")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("elapsed_time: both events must be created with enable_timing=True")
        end.synchronize()
        return (end.t_s - self.t_s) * 1e3
