"""The explicit, framework-agnostic emulator API: copy bytes, run profiled phases, events, synchronize.

Any training loop (PyTorch, TensorFlow, JAX, DALI, plain NumPy) can drive an emulated GPU with it:

    emu = Emulator(gpu="v100")
    for images, labels in loader:                       # the real data pipeline, at real speed
        emu.h2d(images.nbytes, pinned=True)            # queued on the copy engine, host continues
        emu.run_phase("resnet50", "forward", batch_size=len(images))
        emu.run_phase("resnet50", "backward", batch_size=len(images))
        emu.synchronize()                               # e.g. where the script reads the loss

See docs/timeline.md for the timing semantics.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpemu.device.clock import Clock, RealClock
from gpemu.device.gpu import EmulatedGPU
from gpemu.device.graph import GraphCapture
from gpemu.device.timeline import Event, Stream, Work
from gpemu.device.trace import TraceRecorder
from gpemu.errors import GpemuError
from gpemu.estimate import Estimate
from gpemu.hardware import GPUSpec, get_gpu

# Estimate kinds that a profile lookup may answer with before a cost-model prediction is preferred.
_PROFILE_KINDS = ("measured", "interpolated")


class Emulator:
    """One or more emulated GPUs of one model, driven explicitly by a training loop."""

    def __init__(
        self,
        gpu: str | GPUSpec = "v100",
        count: int = 1,
        trace_path: str | Path | None = None,
        db: Any = None,
        clock: Clock | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        if count < 1:
            raise GpemuError(f"count must be >= 1, got {count}")
        self.spec = get_gpu(gpu)
        self.clock: Clock = clock or RealClock()
        self.trace_path = Path(trace_path) if trace_path is not None else None
        self.trace = TraceRecorder() if self.trace_path is not None else None
        self.db = db
        self.devices = [
            EmulatedGPU(self.spec, i, self.clock, self.trace, memory_limit_bytes=memory_limit_bytes)
            for i in range(count)
        ]
        self._local = threading.local()
        self._estimates: dict[tuple[str, str, int, str], Estimate] = {}
        self._closed = False
        if self.trace_path is not None:
            atexit.register(self.close)

    def __repr__(self) -> str:
        return f"<Emulator {len(self.devices)} x {self.spec.name}>"

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- devices and streams -------------------------------------------------------------------------------------
    @property
    def current_device(self) -> EmulatedGPU:
        """Return the device this thread launches on (see `use_device`)."""
        return self.devices[getattr(self._local, "device", 0)]

    @contextlib.contextmanager
    def use_device(self, index: int) -> Iterator[EmulatedGPU]:
        """Launch on device `index` inside the block (like `torch.cuda.device(index)`); yields that device."""
        if not 0 <= index < len(self.devices):
            raise GpemuError(f"device index {index} out of range: this emulator has {len(self.devices)} device(s)")
        previous = getattr(self._local, "device", 0)
        self._local.device = index
        try:
            yield self.devices[index]
        finally:
            self._local.device = previous

    def stream(self, device: int | None = None) -> Stream:
        """Return a new stream on `device` (default: the current device)."""
        dev = self.current_device if device is None else self.devices[device]
        return dev.new_stream()

    def _stream(self, stream: Stream | None) -> Stream:
        return stream if stream is not None else self.current_device.default_stream

    def now(self) -> float:
        """Return the emulator clock's current time in seconds."""
        return self.clock.now()

    # -- work ----------------------------------------------------------------------------------------------------
    def h2d(
        self, size_bytes: int, pinned: bool = True, non_blocking: bool = True, stream: Stream | None = None
    ) -> Work:
        """Copy `size_bytes` host-to-device on the copy engine; return the Work (host blocks unless pinned+async)."""
        return self._copy("h2d", size_bytes, pinned, non_blocking, stream)

    def d2h(
        self, size_bytes: int, pinned: bool = True, non_blocking: bool = False, stream: Stream | None = None
    ) -> Work:
        """Copy `size_bytes` device-to-host on the D2H engine; return the Work (host blocks unless pinned+async)."""
        return self._copy("d2h", size_bytes, pinned, non_blocking, stream)

    def _copy(self, direction: str, size_bytes: int, pinned: bool, non_blocking: bool, stream: Stream | None) -> Work:
        # See Note [Copy semantics] in docs/timeline.md: a copy from pageable memory, or any copy without
        # non_blocking, is synchronous for the host (cudaMemcpy): it waits for the stream's earlier work, then for
        # the copy itself. A pinned non_blocking copy is queued and the host continues at once.
        if size_bytes < 0:
            raise GpemuError(f"{direction}: size_bytes must be >= 0, got {size_bytes}")
        s = self._stream(stream)
        dev = s.device
        if direction == "h2d":
            bw_gbps = self.spec.h2d_pinned_gbps if pinned else self.spec.h2d_pageable_gbps
        else:  # the catalog has no pageable D2H figure; assume the same pinned/pageable ratio as H2D
            ratio = self.spec.h2d_pageable_gbps / self.spec.h2d_pinned_gbps if self.spec.h2d_pinned_gbps else 1.0
            bw_gbps = self.spec.d2h_pinned_gbps * (1.0 if pinned else ratio)
        duration_s = size_bytes / (bw_gbps * 1e9) if bw_gbps > 0 else 0.0
        blocking = not (pinned and non_blocking)
        if blocking:
            dev.host_wait(s.t_done, reason=f"{direction} (waits for stream)")
        work = s.enqueue(
            duration_s,
            f"{direction.upper()} {size_bytes / 1e6:.1f} MB {'pinned' if pinned else 'pageable'}",
            engine=direction,  # type: ignore[arg-type]
            category=direction,
            args={"bytes": size_bytes, "pinned": pinned, "bw_gbps": bw_gbps, "source": f"spec:{self.spec.key}"},
        )
        if direction == "h2d":
            dev.stats.h2d_bytes += size_bytes
        else:
            dev.stats.d2h_bytes += size_bytes
        if blocking:
            dev.host_wait(work.end_s, reason=f"{direction} {'pinned' if pinned else 'pageable'} copy")
        return work

    def compute(self, duration_s: float, name: str = "kernel", stream: Stream | None = None) -> Work:
        """Launch `duration_s` of compute on the stream (host continues at once); return the Work."""
        if duration_s < 0:
            raise GpemuError(f"compute: duration_s must be >= 0, got {duration_s}")
        return self._stream(stream).enqueue(duration_s, name, engine="compute", category="compute")

    def estimate(self, workload: str, phase: str, batch_size: int, dtype: str = "fp32") -> Estimate:
        """Return the time estimate of one phase (profile row, else cost-model prediction), with its source."""
        key = (workload, phase, int(batch_size), dtype)
        cached = self._estimates.get(key)
        if cached is None:
            cached = self._estimates[key] = estimate_phase(self.spec, workload, phase, int(batch_size), dtype, self.db)
        return cached

    def run_phase(
        self, workload: str, phase: str, batch_size: int, dtype: str = "fp32", stream: Stream | None = None
    ) -> Work:
        """Launch one profiled phase (e.g. resnet50 forward at batch 64) as one work item; return the Work."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise GpemuError(f"batch_size must be a positive integer, got {batch_size!r}")
        est = self.estimate(workload, phase, batch_size, dtype)
        return self._stream(stream).enqueue(
            est.value,
            f"{workload} {phase} b{batch_size} {dtype}",
            engine="compute",
            category=phase,
            args={"kind": est.kind, "source": est.source, "path": est.path, "batch_size": batch_size, "dtype": dtype},
        )

    def train_step(self, workload: str, batch_size: int, dtype: str = "fp32", stream: Stream | None = None) -> Work:
        """Launch forward then backward (GPEmu's backward includes the optimizer step); return the backward Work."""
        self.run_phase(workload, "forward", batch_size, dtype, stream)
        return self.run_phase(workload, "backward", batch_size, dtype, stream)

    # -- CUDA graphs (Note [CUDA graphs] in graph.py) -------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, stream: Stream | None = None, mode: str = "global") -> Iterator[GraphCapture]:
        """Capture the work issued to `stream` (default: a new stream) inside the block into a CUDA graph; yields it.

        Inside, pass the stream to h2d / compute / run_phase; nothing runs until `replay(graph)`.
        """
        s = stream if stream is not None else self.stream()
        if s is s.device.default_stream:
            raise GpemuError("capture: CUDA graphs must be captured on a non-default stream (emu.stream())")
        graph = s.device.begin_capture(s, -(s.stream_id + (1 << 30)), mode)  # a private pool of its own
        try:
            yield graph
        finally:
            graph.end()

    def replay(self, graph: GraphCapture, stream: Stream | None = None) -> list[Work]:
        """Launch a captured graph on `stream` (default: its device's default stream): one launch, host continues."""
        return graph.replay(stream if stream is not None else graph.device.default_stream)

    # -- synchronisation -----------------------------------------------------------------------------------------
    def record_event(self, stream: Stream | None = None, enable_timing: bool = True) -> Event:
        """Record and return an event at the tail of the stream."""
        event = Event(enable_timing=enable_timing)
        event.record(self._stream(stream))
        return event

    def wait_event(self, event: Event, stream: Stream | None = None) -> None:
        """Make later work on the stream wait for `event` (no host wait)."""
        self._stream(stream).wait_event(event)

    def synchronize(self, device: int | None = None) -> float:
        """Block the host until all work on one device (default: all devices) is done; return seconds waited."""
        devices = self.devices if device is None else [self.devices[device]]
        deadline_s = max(d.t_done for d in devices)
        return devices[0].host_wait(deadline_s, reason="device synchronize")

    def close(self) -> Path | None:
        """Write the trace (if one was asked for) and return its path; safe to call twice."""
        if self._closed:
            return self.trace_path
        self._closed = True
        if self.trace is not None and self.trace_path is not None:
            return self.trace.write(self.trace_path)
        return None


def estimate_phase(
    spec: GPUSpec, workload: str, phase: str, batch_size: int, dtype: str = "fp32", db: Any = None
) -> Estimate:
    """Return a phase-time Estimate: a measured/interpolated profile row, else the cost model, else an error.

    Order: (1) the profile DB (`db`, else `ProfileDB.default()`), measured or interpolated rows; (2)
    `gpemu.cost.predict.predict_phase` (cross-GPU scaling or the spec model); (3) an extrapolated profile row;
    otherwise a GpemuError naming what is missing.
    """
    problems: list[str] = []
    looked_up: Estimate | None = None
    if db is None:
        try:
            from gpemu.profiles import ProfileDB  # type: ignore[attr-defined]

            db = ProfileDB.default()
        except ImportError:
            problems.append("the profile database (gpemu.profiles.ProfileDB) is not available")
    if db is not None:
        looked_up = db.lookup(spec.key, workload, phase, batch_size, dtype, warn=False)
        if looked_up.kind in _PROFILE_KINDS:
            return looked_up
        problems.append(f"profile lookup: {looked_up.kind} ({looked_up.source})")
    try:
        from gpemu.cost.predict import predict_phase  # type: ignore[import-not-found]
    except ImportError:
        problems.append("the cost model (gpemu.cost.predict) is not available")
    else:
        predicted: Estimate = predict_phase(spec, workload, phase, batch_size, dtype, db)
        if predicted.ok:
            return predicted
        problems.append(f"cost model: {predicted.source}")
    if looked_up is not None and looked_up.ok:
        return looked_up
    raise GpemuError(
        f"no time for {workload} {phase} at batch {batch_size} {dtype} on {spec.key}: " + "; ".join(problems)
        + ". Import a profile (`gpemu import-gpemu PATH`) or measure one (`gpemu profile`)."
    )
