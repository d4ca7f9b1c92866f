"""Plots of run reports: per-iteration wall time split into GPU busy, GPU idle on data, and other idle time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpemu.errors import GpemuError

# Note [Iteration plot]: each bar is one iteration's wall time (report rows, Note [Iterations] in collector.py),
# stacked from the bottom as GPU busy (compute-engine busy inside the window), GPU idle while the host waited for the
# loader (gpu_idle_data_s: the data stall the plot is for), and the rest of the idle time (host work, syncs, the
# emulator's own host work). busy + idle = wall for every row, so the stack's height is the wall time. Warm-up
# iterations (the report's first `warmup_iterations`) and a partial last one (closed at the final sync), which the
# summary leaves out, are drawn faded; evaluation
# iterations (no backward, no optimizer step) are hatched. Several reports are drawn side by side on one y axis, the
# comparison a data-stall study makes (0 vs 2 DataLoader workers, one GPU vs another).
COLORS = {"busy": "#2a7ab0", "data": "#d95f02", "other": "#bdbdbd"}


@dataclass(frozen=True)
class IterationSeries:
    """One report's iterations as plot columns, in milliseconds."""

    label: str
    busy_ms: list[float]
    idle_data_ms: list[float]
    idle_other_ms: list[float]
    warmup: int
    train: list[bool]
    partial: list[bool]
    gpu_busy_pct: float | None
    fetch_stall_pct: float | None

    @property
    def wall_ms(self) -> list[float]:
        """Return each iteration's wall time (the stack's height)."""
        return [b + d + o for b, d, o in zip(self.busy_ms, self.idle_data_ms, self.idle_other_ms, strict=True)]


def iteration_series(report: dict[str, Any], label: str) -> IterationSeries:
    """Return a report's iterations as busy / idle-on-data / other-idle milliseconds (Note [Iteration plot])."""
    rows = report.get("iterations") or []
    if not rows:
        raise GpemuError(f"report {label!r} has no iterations to plot (did the script run a DataLoader loop?)")
    busy, data, other, train, partial = [], [], [], [], []
    for r in rows:
        wall = float(r["wall_s"])
        b = min(float(r["gpu_busy_s"]), wall)
        d = min(float(r.get("gpu_idle_data_s", 0.0)), wall - b)
        busy.append(b * 1e3)
        data.append(d * 1e3)
        other.append(max(wall - b - d, 0.0) * 1e3)
        train.append(bool(r.get("train", True)))
        partial.append(bool(r.get("partial", False)))
    summary = report.get("summary") or {}
    return IterationSeries(label, busy, data, other, int(report.get("warmup_iterations", 0)), train, partial,
                           summary.get("gpu_busy_pct"), summary.get("fetch_stall_pct"))


def load_report(path: Path) -> dict[str, Any]:
    """Read a run report JSON (`gpemu run --report-json`), with an error naming the file when it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except OSError as exc:
        raise GpemuError(f"cannot read report {str(path)!r}: {exc.strerror}") from exc
    except ValueError as exc:
        raise GpemuError(f"{str(path)!r} is not JSON: {exc}") from exc
    if not isinstance(report, dict) or "iterations" not in report:
        raise GpemuError(f"{str(path)!r} is not a gpemu run report (no 'iterations'; write one with "
                         "`gpemu run --report-json`)")
    return report


def _label(report: dict[str, Any], fallback: str) -> str:
    gpu, model = report.get("gpu"), report.get("model")
    return " / ".join(str(x) for x in (fallback, gpu, model) if x)


def plot_reports(reports: Sequence[tuple[str, dict[str, Any]]], out: Path, title: str | None = None) -> Path:
    """Draw each (label, report) as a panel of per-iteration stacked bars (Note [Iteration plot]); write `out`."""
    if not reports:
        raise GpemuError("no report to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a CI machine or a server
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise GpemuError("plots need matplotlib: pip install 'gpemu[plots]' (or matplotlib)") from exc
    series = [iteration_series(rep, _label(rep, label)) for label, rep in reports]
    fig, axes = plt.subplots(1, len(series), figsize=(max(6.0, 5.0 * len(series)), 4.2), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], series, strict=True):
        x = list(range(len(s.busy_ms)))
        for i in x:
            alpha = 0.45 if i < s.warmup or s.partial[i] else 1.0
            hatch = "//" if not s.train[i] else None
            bottom = 0.0
            for key, values in (("busy", s.busy_ms), ("data", s.idle_data_ms), ("other", s.idle_other_ms)):
                ax.bar(i, values[i], bottom=bottom, color=COLORS[key], alpha=alpha, hatch=hatch, width=0.85,
                       edgecolor="white", linewidth=0.3)
                bottom += values[i]
        stats = []
        if s.gpu_busy_pct is not None:
            stats.append(f"GPU busy {s.gpu_busy_pct:.0f}%")
        if s.fetch_stall_pct is not None:
            stats.append(f"fetch stall {s.fetch_stall_pct:.0f}%")
        ax.set_title(s.label + ("\n" + " · ".join(stats) if stats else ""), fontsize=9)
        ax.set_xlabel("iteration (faded: warm-up, or last, closed at the final sync; hatched: evaluation)", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("wall time per iteration (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("busy", "data", "other")]
    fig.legend(handles, ["GPU busy", "GPU idle: host waiting for data", "GPU idle: other (host work, syncs)"],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
