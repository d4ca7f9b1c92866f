"""EmulatedGPU: one emulated device with a compute engine, copy engines, streams, statistics and a trace."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpemu.device.allocator import CachingAllocator
from gpemu.device.clock import Clock, RealClock
from gpemu.device.graph import GraphCapture, GraphCaptureError
from gpemu.device.timeline import DEFAULT_LAUNCH_QUEUE_DEPTH, Engine, Stream, Work
from gpemu.device.trace import TraceRecorder
from gpemu.hardware import GPUSpec, get_gpu


@dataclass
class DeviceStats:
    """Running totals for the end-of-run report."""

    host_wait_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    work_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # by category
    work_count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    h2d_bytes: int = 0
    d2h_bytes: int = 0


class DeviceListener(Protocol):
    """What an observer of an EmulatedGPU implements (run report, memory report, a future sharing daemon)."""

    def on_work(self, work: Work) -> None:
        """Called once per work item when it is placed on an engine (start_s/end_s are final)."""

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        """Called after the host waited on this device from start_s to end_s."""


class EmulatedGPU:
    """An emulated GPU: a spec, engines, streams, a clock to wait on and an optional trace."""

    def __init__(
        self,
        spec: GPUSpec | str,
        index: int = 0,
        clock: Clock | None = None,
        trace: TraceRecorder | None = None,
        launch_queue_depth: int = DEFAULT_LAUNCH_QUEUE_DEPTH,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.spec = get_gpu(spec)
        self.index = index
        self.clock: Clock = clock or RealClock()
        self.trace = trace
        self.launch_queue_depth = launch_queue_depth
        self.memory_limit_bytes = memory_limit_bytes if memory_limit_bytes is not None else self.spec.memory_bytes
        self.lock = threading.RLock()
        self.engines: dict[str, Engine] = {name: Engine(name) for name in ("compute", "h2d", "d2h")}
        self.default_stream = Stream(self, stream_id=0)
        self.streams: list[Stream] = [self.default_stream]
        self.stats = DeviceStats()
        self._listeners: tuple[DeviceListener, ...] = ()
        self.captures: set[GraphCapture] = set()  # CUDA graph captures underway (Note [CUDA graphs] in graph.py)
        self.allocator = CachingAllocator(
            self.memory_limit_bytes,
            int(self.spec.context_mib * 1024**2),
            device_index=index,
            on_change=self._memory_changed if trace is not None else None,
        )

    def __repr__(self) -> str:
        return f"<EmulatedGPU cuda:{self.index} {self.spec.name}>"

    def new_stream(self, priority: int = 0) -> Stream:
        """Create a new stream on this device."""
        stream = Stream(self, priority=priority)
        with self.lock:
            self.streams.append(stream)
        return stream

    @property
    def t_done(self) -> float:
        """Return when all work queued on every stream of this device finishes."""
        return max(s.t_done for s in self.streams)

    def synchronize(self) -> None:
        """Block the host until every stream of this device is idle (torch.cuda.synchronize)."""
        self.host_wait(self.t_done, reason="device synchronize")

    def add_listener(self, listener: DeviceListener) -> Callable[[], None]:
        """Register `listener` for work and host waits on this device; return a function that removes it."""
        with self.lock:
            self._listeners = (*self._listeners, listener)

        def remove() -> None:
            with self.lock:
                self._listeners = tuple(x for x in self._listeners if x is not listener)

        return remove

    def begin_capture(self, stream: Stream, pool_id: int, mode: str = "global") -> GraphCapture:
        """Start capturing a CUDA graph on `stream` into allocator pool `pool_id` (Note [CUDA graphs])."""
        if mode not in ("global", "thread_local", "relaxed"):
            raise GraphCaptureError(f"capture_error_mode {mode!r}: expected 'global', 'thread_local' or 'relaxed'")
        capture = GraphCapture(stream, pool_id, mode)
        with self.lock:
            self.captures.add(capture)
        return capture

    def check_not_capturing(self, reason: str) -> None:
        """Raise GraphCaptureError if a host synchronisation (`reason`) is illegal now: a capture is underway in
        "global" mode (any thread) or in "thread_local" mode on this thread ("relaxed" allows it), as in CUDA."""
        for capture in self.captures:
            if capture.mode == "global" or (capture.mode == "thread_local" and capture.thread == threading.get_ident()):
                raise GraphCaptureError(
                    f"{reason} while CUDA graph {capture.graph_id} is being captured on cuda:{self.index}: operation "
                    "not permitted when stream is capturing (cudaErrorStreamCaptureUnsupported, as on a GPU). Move "
                    "host reads (.item(), .cpu(), printing a tensor), synchronize calls and pageable host-to-device "
                    "copies out of the captured region.")

    def host_wait(self, deadline_s: float, reason: str = "wait") -> float:
        """Block the calling host thread until `deadline_s`; return the seconds waited (recorded in stats/trace)."""
        if self.captures:
            self.check_not_capturing(reason)
        start = self.clock.now()
        if deadline_s <= start:
            return 0.0
        self.clock.sleep_until(deadline_s)
        end = self.clock.now()
        self.stats.host_wait_s[reason] += end - start
        if self.trace is not None:
            self.trace.host_span(f"wait: {reason}", start, end, category="sync")
        for listener in self._listeners:
            listener.on_host_wait(start, end, reason)
        return end - start

    def _record(self, work: Work) -> None:
        stats = self.stats
        category = work.category
        stats.work_s[category] += work.end_s - work.start_s  # work.duration_s without the property call
        stats.work_count[category] += 1
        if self.trace is not None:
            self.trace.work(work)
        for listener in self._listeners:
            listener.on_work(work)

    def _memory_changed(self, allocated_bytes: int, reserved_bytes: int) -> None:
        if self.trace is not None:
            self.trace.counter(
                "memory (MiB)",
                self.clock.now(),
                self.index,
                allocated=allocated_bytes / 2**20,
                reserved=reserved_bytes / 2**20,
            )

    def busy_s(self, engine: str = "compute") -> float:
        """Return total busy seconds of one engine so far."""
        return self.engines[engine].busy_s
