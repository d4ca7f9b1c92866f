"""CUDA graphs on the emulated timeline: what the capturing streams issue is recorded, and replayed with one launch."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpemu.device.timeline import Work
from gpemu.errors import GpemuError

if TYPE_CHECKING:
    from gpemu.device.timeline import EngineName, Stream

# Note [CUDA graphs]
# A CUDA graph is work captured once and launched again as one unit: `cudaStreamBeginCapture` puts a stream in
# capture mode, every kernel, memcpy and event record/wait issued to it (and to the streams that join it by waiting on
# one of its events) becomes a node instead of running, `cudaStreamEndCapture` closes the graph and `cudaGraphLaunch`
# runs all of its nodes after the work already queued on the launching stream, in their captured dependency order,
# for one host launch (one launch-queue slot) instead of one per kernel. On the emulated timeline:
#   capture   Stream.capture is set: enqueue() appends a node (its predicted duration, engine, category, args) and
#             returns at once without touching the timeline; an event recorded on a capturing stream marks a node
#             position, and a stream that waits on such an event joins the capture (CUDA's fork); wait_stream is an
#             event record + wait, as in torch. Host synchronisation with a capture underway (synchronize, .item(),
#             .cpu(), a pageable copy, event.synchronize) raises, as the driver does (cudaErrorStreamCaptureUnsupported
#             in the default "global" capture mode, which also forbids it from other threads).
#   end       consecutive nodes of one stream on one engine with one category merge into one item of their summed
#             duration and launch count: a replay places a handful of items, whatever the kernel count, so the
#             emulator's own host time per replay stays ~10-50 us (placing each kernel would cost the host a few
#             microseconds per node, the very overhead graphs exist to remove).
#   replay    at the host time of the call, each captured stream maps to a replay stream (the origin to the launching
#             stream, forked ones to private streams of the graph, which first wait for the launching stream's
#             tail); nodes are placed in captured order after one launch latency, events and waits are resolved
#             between them, and the launching stream then waits for every branch (CUDA's join). Kernel durations are
#             the captured predictions: a graph launched on another GPU model than it was captured on is not repriced
#             (as on a GPU, a graph belongs to the device it was captured on).
# Memory: allocations made while capturing come from the graph's private pool (the allocator keys its free lists by
# pool id: Stream.pool_id is the capture's pool while capturing, else the stream id), so blocks freed during capture
# stay reserved for that pool and eager code after it cannot reuse them, as with torch's graph pools; graphs given the
# same pool (graph_pool_handle(), other_graph.pool()) share it. While a graph using a pool lives, empty_cache and the
# OOM retry keep the pool's cached segments (release() on reset or deletion lets them go). A replay allocates nothing.
# Not modelled: the small per-node speedup of graph launches on the GPU side (kernels keep their k0 gap), conditional
# nodes, graph updates (cudaGraphExecUpdate), and repricing a graph for a changed TF32/autocast setting.

_graph_ids = itertools.count(1)

WORK, RECORD, WAIT = 0, 1, 2


class GraphCaptureError(GpemuError, RuntimeError):
    """A host synchronisation or an invalid call while a CUDA graph capture is underway (as the driver raises)."""


@dataclass(slots=True)
class Node:
    """One captured node: a work item (kernel, copy, phase chunk), an event record, or an event wait."""

    kind: int
    stream_id: int  # the captured stream that issued it
    duration_s: float = 0.0
    name: str = ""
    engine: EngineName = "compute"
    category: str = "kernel"
    args: dict[str, object] = field(default_factory=dict)
    launches: int = 1
    event: int = -1  # RECORD / WAIT: the event's number in this capture


class GraphCapture:
    """The nodes one CUDA graph captured on one device, and their replay (see Note [CUDA graphs])."""

    def __init__(self, origin: Stream, pool_id: int, mode: str = "global") -> None:
        self.device = origin.device
        self.origin_id = origin.stream_id
        self.pool_id = pool_id
        self.mode = mode
        self.thread = threading.get_ident()  # the capturing thread ("thread_local" mode)
        self.graph_id = next(_graph_ids)
        self.nodes: list[Node] = []
        self.kernels = 0  # launches captured (kernels and copies)
        self.work_s = 0.0  # their summed duration
        self.capturing = True
        self._streams: list[Stream] = []
        self._events = itertools.count()
        self._replay_streams: dict[int, Stream] = {}
        self._holds_pool = True
        self.device.allocator.hold_pool(pool_id)
        self.join(origin)

    def __repr__(self) -> str:
        return (f"<GraphCapture {self.graph_id} on cuda:{self.device.index}: {self.kernels} launches, "
                f"{self.work_s * 1e3:.3f} ms, {len(self.nodes)} nodes>")

    def join(self, stream: Stream) -> None:
        """Put `stream` into this capture (the origin at capture_begin; a forked stream when it waits on an event)."""
        if stream.capture is self:
            return
        if stream.capture is not None:
            raise GraphCaptureError(f"stream {stream.stream_id} is already capturing graph {stream.capture.graph_id}")
        stream.capture = self
        stream.pool_id = self.pool_id
        self._streams.append(stream)

    def add_work(self, stream: Stream, duration_s: float, name: str, engine: EngineName, category: str,
                 args: dict[str, object], launches: int) -> Work:
        """Record one work item issued to a capturing stream; return a Work that is not on the timeline."""
        self.nodes.append(Node(WORK, stream.stream_id, max(0.0, duration_s), name, engine, category, args,
                               max(1, launches)))
        self.kernels += max(1, launches)
        self.work_s += max(0.0, duration_s)
        now = self.device.clock.now()
        return Work(name, engine, stream.stream_id, self.device.index, now, now, now, category,
                    {**args, "captured": self.graph_id})

    def add_record(self, stream: Stream) -> int:
        """Record an event on a capturing stream; return its number in this capture."""
        number = next(self._events)
        self.nodes.append(Node(RECORD, stream.stream_id, event=number))
        return number

    def add_wait(self, stream: Stream, event: int) -> None:
        """Make `stream` (joining the capture if it is not in it) wait for captured event `event`."""
        self.join(stream)
        self.nodes.append(Node(WAIT, stream.stream_id, event=event))

    def end(self) -> None:
        """End the capture: release its streams and merge consecutive nodes of one stream, engine and category."""
        for stream in self._streams:
            stream.capture = None
            stream.pool_id = stream.stream_id
        self._streams = []
        self.capturing = False
        self.device.captures.discard(self)
        merged: list[Node] = []
        for node in self.nodes:
            last = merged[-1] if merged else None
            if (node.kind == WORK and last is not None and last.kind == WORK and last.stream_id == node.stream_id
                    and last.engine == node.engine and last.category == node.category):
                last.duration_s += node.duration_s
                last.launches += node.launches
                continue
            if node.kind == WORK:
                node = Node(WORK, node.stream_id, node.duration_s, f"cuda graph {self.graph_id}", node.engine,
                            node.category, {"timing": "cuda-graph", "graph": self.graph_id, "first": node.name},
                            node.launches)
            merged.append(node)
        for node in merged:
            if node.kind == WORK:
                node.args["kernels"] = node.launches
        self.nodes = merged

    def release(self) -> None:
        """Let the private pool go (the graph was reset or deleted): empty_cache may release its free segments."""
        if self._holds_pool:
            self._holds_pool = False
            self.device.allocator.hold_pool(self.pool_id, -1)

    def replay(self, launch: Stream) -> list[Work]:
        """Launch the captured graph on `launch` (one launch-queue slot); return the placed Works."""
        if self.capturing:
            raise GraphCaptureError(f"graph {self.graph_id}: replay() before capture_end()")
        device = launch.device
        if device is not self.device:
            raise GraphCaptureError(f"graph {self.graph_id} was captured on cuda:{self.device.index}, "
                                    f"replayed on cuda:{device.index}")
        if len(launch._pending) + 1 > device.launch_queue_depth:
            launch._wait_for_queue_slots(1)
        works: list[Work] = []
        with device.lock:
            now = device.clock.now()
            earliest_s = now + device.spec.launch_overhead_us * 1e-6
            fork_s = launch.t_done  # the graph starts after the launching stream's queued work
            streams = {self.origin_id: launch}
            events: dict[int, float] = {}
            for node in self.nodes:
                stream = streams.get(node.stream_id)
                if stream is None:
                    stream = self._replay_streams.get(node.stream_id)
                    if stream is None:
                        stream = self._replay_streams[node.stream_id] = device.new_stream()
                    stream.t_done = max(stream.t_done, fork_s)
                    streams[node.stream_id] = stream
                if node.kind == WORK:
                    works.append(stream._place(earliest_s, device.engines[node.engine], node.duration_s, node.name,
                                               node.engine, node.category, dict(node.args), node.launches, now,
                                               queued=False))
                elif node.kind == RECORD:
                    events[node.event] = stream.t_done
                else:
                    stream.t_done = max(stream.t_done, events.get(node.event, 0.0))
            for stream in streams.values():
                launch.t_done = max(launch.t_done, stream.t_done)
            launch._pending.append(launch.t_done)
        return works
