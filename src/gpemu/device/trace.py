"""Trace recorder: host spans, device work and counters, written as a Chrome/Perfetto JSON trace."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpemu.device.timeline import Work


@dataclass
class TraceRecorder:
    """Collects events in memory (bounded) and writes Chrome trace JSON (open it at ui.perfetto.dev)."""

    max_events: int = 2_000_000
    origin_s: float | None = None
    events: list[dict[str, object]] = field(default_factory=list)
    dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _us(self, t_s: float) -> float:
        if self.origin_s is None:
            self.origin_s = t_s
        return (t_s - self.origin_s) * 1e6

    def _add(self, event: dict[str, object]) -> None:
        with self._lock:
            if len(self.events) >= self.max_events:
                self.dropped += 1
                return
            self.events.append(event)

    def work(self, work: Work) -> None:
        """Record one device work item on its (device, stream/engine) track."""
        tid = f"stream {work.stream_id}" if work.engine == "compute" else f"{work.engine} copy engine"
        self._add(
            {
                "name": work.name,
                "cat": work.category,
                "ph": "X",
                "ts": self._us(work.start_s),
                "dur": max(0.0, work.duration_s) * 1e6,
                "pid": f"GPU {work.device_index} (emulated)",
                "tid": tid,
                "args": dict(work.args),
            }
        )

    def host_span(self, name: str, start_s: float, end_s: float, category: str = "host", **args: object) -> None:
        """Record a span of host time (a wait, a data fetch, an iteration) on the calling thread's track."""
        self._add(
            {
                "name": name,
                "cat": category,
                "ph": "X",
                "ts": self._us(start_s),
                "dur": max(0.0, end_s - start_s) * 1e6,
                "pid": f"host (pid {os.getpid()})",
                "tid": threading.current_thread().name,
                "args": args,
            }
        )

    def counter(self, name: str, t_s: float, device_index: int, **values: float) -> None:
        """Record a counter sample (e.g. memory allocated) on the device's process track."""
        self._add({"name": name, "ph": "C", "ts": self._us(t_s), "pid": f"GPU {device_index} (emulated)", "args": values})

    def to_json(self) -> dict[str, object]:
        """Return the trace as a Chrome-trace dict."""
        with self._lock:
            events = sorted(self.events, key=lambda e: float(e["ts"]))  # type: ignore[arg-type]
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"dropped_events": self.dropped}}

    def write(self, path: str | Path) -> Path:
        """Write the trace atomically to `path` and return it."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json()), encoding="utf-8")
        tmp.replace(path)
        return path
