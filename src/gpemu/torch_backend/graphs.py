"""CUDA graphs in the drop-in: torch.cuda.CUDAGraph, torch.cuda.graph, graph_pool_handle, is_current_stream_capturing.

Capture records what the captured region issues on the emulated timeline; replay launches it again for one host
launch (Note [CUDA graphs] in gpemu/device/graph.py). torch's own `make_graphed_callables` runs unchanged on top.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from gpemu.device.graph import WORK, GraphCapture, GraphCaptureError
from gpemu.torch_backend import state

_pool_numbers = itertools.count(1)


def graph_pool_handle() -> tuple[int, int]:
    """torch.cuda.graph_pool_handle: a token naming a new private memory pool that graphs may share."""
    return (0, next(_pool_numbers))


def _pool_token(pool: Any) -> tuple[int, int]:
    """Return the (0, n) token of a pool argument (a token, or a torch.cuda.MemPool); its allocator pool id is -n,
    apart from stream ids."""
    handle = getattr(pool, "id", pool)  # a MemPool: its id tuple
    try:
        token = tuple(handle)
        return int(token[0]), int(token[-1])
    except (TypeError, ValueError, IndexError):
        raise GraphCaptureError(f"pool={handle!r}: expected a token from torch.cuda.graph_pool_handle() or "
                                "other_graph.pool()") from None


def is_current_stream_capturing() -> bool:
    """torch.cuda.is_current_stream_capturing: True while the current emulated stream is capturing a graph."""
    emu = state.current_emulation()
    return emu is not None and emu.current_stream(emu.current_device()).capture is not None


class CUDAGraph:
    """torch.cuda.CUDAGraph on an emulated GPU: capture_begin/capture_end record, replay() launches the recording."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._capture: GraphCapture | None = None
        self._pool: tuple[int, int] | None = None
        self._debug = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **kwargs: Any) -> None:
        """Start capturing the current stream's work into this graph (use torch.cuda.graph instead where you can)."""
        if self._capture is not None:
            raise GraphCaptureError("This CUDAGraph instance already owns a captured graph. To capture a new graph, "
                                    "create a new instance (or call reset() first).")
        emu = state.require()
        index = emu.current_device()
        device = emu.devices[index]
        stream = emu.current_stream(index)
        if stream is device.default_stream:
            raise GraphCaptureError("CUDA graphs must be captured on a non-default stream. (However, after capture, "
                                    "it's ok to replay them on the default stream.) Capture inside "
                                    "`with torch.cuda.graph(g):` or `with torch.cuda.stream(torch.cuda.Stream()):`.")
        self._pool = _pool_token(pool) if pool is not None else graph_pool_handle()
        self._capture = device.begin_capture(stream, -self._pool[1], capture_error_mode)
        emu.phases.capturing += 1  # per-op kernel prices inside (Note [Phases and CUDA graphs] in phases.py)

    def capture_end(self) -> None:
        """End the capture begun by capture_begin()."""
        if self._capture is None or not self._capture.capturing:
            raise GraphCaptureError("capture_end() without a capture underway (call capture_begin() first)")
        self._capture.end()
        phases = state.require().phases
        phases.capturing = max(0, phases.capturing - 1)

    def instantiate(self) -> None:
        """No-op: an emulated graph is ready to replay when its capture ends."""

    def replay(self) -> None:
        """Launch the captured work on the current stream (one launch; the host does not wait)."""
        if self._capture is None or self._capture.capturing:
            raise GraphCaptureError("Called CUDAGraph.replay() without a preceding successful capture.")
        emu = state.require()
        emu.phases.graph_replay()  # See Note [Phases and CUDA graphs] in phases.py
        self._capture.replay(emu.current_stream(self._capture.device.index))

    def reset(self) -> None:
        """Drop the captured graph; its private pool's free blocks go at the next empty_cache (if no graph shares it)."""
        if self._capture is not None:
            self._capture.release()
        self._capture = None

    def __del__(self) -> None:
        capture = getattr(self, "_capture", None)
        if capture is not None:
            capture.release()

    def pool(self) -> tuple[int, int]:
        """Return the token of this graph's memory pool, to share it with a later capture."""
        if self._pool is None:
            raise GraphCaptureError("pool() before capture_begin(): the graph has no memory pool yet")
        return self._pool

    def enable_debug_mode(self) -> None:
        """Keep the captured nodes for debug_dump() (they are always kept here)."""
        self._debug = True

    def debug_dump(self, debug_path: str, *args: Any, **kwargs: Any) -> None:
        """Write the captured graph (merged nodes: stream, engine, kernels, predicted seconds) as JSON."""
        if self._capture is None:
            raise GraphCaptureError("debug_dump() without a captured graph")
        c = self._capture
        nodes = [{"kind": ("work", "record", "wait")[n.kind], "stream": n.stream_id, "name": n.name,
                  "engine": n.engine, "category": n.category, "kernels": n.launches if n.kind == WORK else 0,
                  "duration_s": n.duration_s, "event": n.event} for n in c.nodes]
        Path(debug_path).write_text(json.dumps({"graph": c.graph_id, "device": c.device.index, "kernels": c.kernels,
                                                "work_s": c.work_s, "nodes": nodes}, indent=1))

    def __repr__(self) -> str:
        return f"<torch.cuda.CUDAGraph (emulated) {self._capture!r}>"


class graph:  # torch's name (lower case)
    """torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global"): capture the block into `g`."""

    default_capture_stream: Any = None

    def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", **kwargs: Any) -> None:
        import torch

        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.cuda.Stream()
        self.pool = pool
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.cuda.stream(self.capture_stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        import torch

        torch.cuda.synchronize()  # as torch: free what can be freed for the graph
        torch.cuda.empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.cuda_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(*exc)


class AcceleratorGraph(CUDAGraph):
    """torch.accelerator.Graph on an emulated GPU: pool and error mode given at construction; a context manager
    capturing on the current stream (`with stream, graph:`)."""

    def __init__(self, keep_graph: bool = False, *, pool: Any = None, capture_error_mode: str = "default") -> None:
        super().__init__(keep_graph)
        self.graph_pool = pool
        self.capture_error_mode = capture_error_mode

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        """Begin capturing on the current stream with the pool and error mode given at construction."""
        mode = "global" if self.capture_error_mode == "default" else self.capture_error_mode
        super().capture_begin(self.graph_pool, capture_error_mode=mode)

    def __enter__(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.capture_begin()

    def __exit__(self, *exc: object) -> None:
        self.capture_end()


def apply(patcher: Any) -> None:
    """Install the graph API in torch.cuda.graphs, where torch's make_graphed_callables looks its helpers up."""
    import torch.cuda.graphs as graphs_mod

    for name, value in (("CUDAGraph", CUDAGraph), ("graph", graph), ("graph_pool_handle", graph_pool_handle),
                        ("is_current_stream_capturing", is_current_stream_capturing)):
        if hasattr(graphs_mod, name):
            patcher.set(graphs_mod, name, value)
    patcher.set(graph, "default_capture_stream", None)  # its stream belongs to one emulation
