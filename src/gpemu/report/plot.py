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
# comparison a data-stall study makes (0 vs 2 DataLoader workers, one GPU vs another). A report of a real-GPU run
# (`gpemu run --gpu real`, the reference side of `gpemu validate`) measures no device activity: its bars are the
# host's wait for data and the rest of the iteration, in a darker grey, so it is never drawn as an idle GPU.
COLORS = {"busy": "#2a7ab0", "data": "#d95f02", "other": "#bdbdbd", "unmeasured": "#6f6f6f"}
LEGEND = {"busy": "GPU busy", "data": "GPU idle: host waiting for data", "other": "GPU idle: other (host work, syncs)",
          "unmeasured": "rest of the iteration (real GPU: device activity not measured)"}


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
    gpu_measured: bool = True  # False for a real-GPU run: idle_other_ms is then the unmeasured rest

    @property
    def wall_ms(self) -> list[float]:
        """Return each iteration's wall time (the stack's height)."""
        return [b + d + o for b, d, o in zip(self.busy_ms, self.idle_data_ms, self.idle_other_ms, strict=True)]


def iteration_series(report: dict[str, Any], label: str) -> IterationSeries:
    """Return a report's iterations as busy / idle-on-data / other-idle milliseconds (Note [Iteration plot])."""
    rows = report.get("iterations") or []
    if not rows:
        raise GpemuError(f"report {label!r} has no iterations to plot (did the script run a DataLoader loop?)")
    measured = not str(report.get("gpu") or "").startswith("real ")
    busy, data, other, train, partial = [], [], [], [], []
    for r in rows:
        wall = float(r["wall_s"])
        b = min(float(r.get("gpu_busy_s", 0.0)), wall) if measured else 0.0
        d = min(float(r.get("gpu_idle_data_s" if measured else "data_wait_s", 0.0)), wall - b)
        busy.append(b * 1e3)
        data.append(d * 1e3)
        other.append(max(wall - b - d, 0.0) * 1e3)
        train.append(bool(r.get("train", True)))
        partial.append(bool(r.get("partial", False)))
    summary = report.get("summary") or {}
    return IterationSeries(label, busy, data, other, int(report.get("warmup_iterations", 0)), train, partial,
                           summary.get("gpu_busy_pct") if measured else None, summary.get("fetch_stall_pct"),
                           measured)


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


def _pyplot() -> tuple[Any, Any]:
    """Return (matplotlib.pyplot, matplotlib.ticker) on the file-only Agg backend, or say how to install them."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a CI machine or a server
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except ImportError as exc:
        raise GpemuError("plots need matplotlib: pip install 'gpemu[plots]' (or matplotlib)") from exc
    return plt, ticker


def _save(plt: Any, fig: Any, out: Path) -> Path:
    """Write `fig` to `out` (creating its folder) and release it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_reports(reports: Sequence[tuple[str, dict[str, Any]]], out: Path, title: str | None = None) -> Path:
    """Draw each (label, report) as a panel of per-iteration stacked bars (Note [Iteration plot]); write `out`."""
    if not reports:
        raise GpemuError("no report to plot")
    plt, ticker = _pyplot()
    series = [iteration_series(rep, _label(rep, label)) for label, rep in reports]
    fig, axes = plt.subplots(1, len(series), figsize=(max(6.0, 5.0 * len(series)), 4.2), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], series, strict=True):
        x = list(range(len(s.busy_ms)))
        for i in x:
            alpha = 0.45 if i < s.warmup or s.partial[i] else 1.0
            hatch = "//" if not s.train[i] else None
            bottom = 0.0
            rest = "other" if s.gpu_measured else "unmeasured"
            for key, values in (("busy", s.busy_ms), ("data", s.idle_data_ms), (rest, s.idle_other_ms)):
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
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # iterations are whole numbers
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("wall time per iteration (ms)")
    keys = ["busy", "data", "other"] if any(s.gpu_measured for s in series) else ["data"]
    keys += ["unmeasured"] if not all(s.gpu_measured for s in series) else []
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in keys]
    fig.legend(handles, [LEGEND[k] for k in keys], loc="lower center", ncol=min(len(keys), 3), fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(plt, fig, out)


# Note [Batch sweep plot]: `gpemu predict --plot` answers the question a single figure cannot: where does this model
# stop scaling with the batch on this GPU, and where does it stop fitting. For each batch size of the sweep (powers of
# two up to past the memory limit, and the asked batch) it draws samples/s of the predicted training step (forward +
# backward, GPEmu's "backward" holding loss, zero_grad and the optimizer step) or inference forward, one marker
# shape per source (measured, interpolated, extrapolated, predicted), a band of +-(median expected |error|) where a
# path has one, and a shaded region from the first batch whose predicted memory does not fit the device (reserved
# peak + CUDA context over CUDA's total, the figure an OOM compares with). Host-to-device copies are a second, dashed
# line (samples/s the copy engine could feed from pageable memory: the data-side ceiling a loader must keep up with),
# or a note when that ceiling is far above the step.
SOURCE_MARKERS = {"measured": "o", "interpolated": "s", "extrapolated": "^", "predicted": "D"}


@dataclass(frozen=True)
class SweepPoint:
    """One batch size of a predict sweep: samples/s of the step and of the H2D copy, where it came from, memory."""

    batch_size: int
    samples_per_s: float
    h2d_samples_per_s: float | None
    source: str
    expected_abs_pct: float | None
    peak_mib: float | None
    fits: bool | None = None  # the memory prediction's verdict (reserved peak + context), None when unknown


def sweep_point(out: dict[str, Any]) -> SweepPoint:
    """Return a predict_step object (the `gpemu predict --json` one) as a sweep point (Note [Batch sweep plot])."""
    phases = out["phases"]
    names = ["inference"] if out.get("mode") == "infer" else ["forward", "backward"]
    seconds = sum(float(phases[n]["seconds"]) for n in names)
    sources = [str(phases[n]["source"]) for n in names]
    source = next((s for s in ("predicted", "extrapolated", "interpolated") if s in sources), "measured")
    errors = [phases[n].get("expected_error") for n in names]
    expected = max((float(e["median_abs_pct"]) for e in errors if e), default=None)
    h2d = phases.get("h2d", {}).get("seconds")
    memory = out.get("memory") or {}
    batch = int(out["batch_size"])
    return SweepPoint(batch, batch / seconds, batch / float(h2d) if h2d else None, source, expected,
                      memory.get("peak_mib"), memory.get("fits"))


def plot_batch_sweep(points: Sequence[SweepPoint], device_mib: float, out: Path, title: str,
                     asked_batch: int | None = None) -> Path:
    """Draw a predict sweep (Note [Batch sweep plot]) into `out`."""
    if not points:
        raise GpemuError("no batch size to plot")
    plt, ticker = _pyplot()
    points = sorted(points, key=lambda p: p.batch_size)
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    xs = [p.batch_size for p in points]
    ys = [p.samples_per_s for p in points]
    ax.plot(xs, ys, color=COLORS["busy"], linewidth=1.2, label="training step" if "infer" not in title else "inference")
    lo = [p.samples_per_s / (1 + p.expected_abs_pct / 100) if p.expected_abs_pct else p.samples_per_s for p in points]
    hi = [p.samples_per_s / max(1 - p.expected_abs_pct / 100, 0.05) if p.expected_abs_pct else p.samples_per_s
          for p in points]
    ax.fill_between(xs, lo, hi, color=COLORS["busy"], alpha=0.15, linewidth=0, label="+- median expected |error|")
    for source, marker in SOURCE_MARKERS.items():
        sel = [p for p in points if p.source == source]
        if sel:
            ax.scatter([p.batch_size for p in sel], [p.samples_per_s for p in sel], marker=marker, s=28,
                       color=COLORS["busy"], zorder=3, label=source)
    top = 1.3 * max(max(ys), max(hi))
    h2d = [(p.batch_size, p.h2d_samples_per_s) for p in points if p.h2d_samples_per_s]
    if h2d and min(v for _, v in h2d) < top:
        ax.plot([b for b, _ in h2d], [min(v, top) for _, v in h2d], color=COLORS["data"], linestyle="--",
                linewidth=1, label="H2D copy ceiling (pageable)")
    elif h2d:  # far above the step: a line at the top would flatten the curve the plot is for
        ax.text(0.01, 0.97, f"pageable H2D copies could feed {min(v for _, v in h2d):,.0f} samples/s (above the plot)",
                transform=ax.transAxes, fontsize=7, va="top", color=COLORS["data"])
    ax.set_ylim(0, top)
    over = [p.batch_size for p in points
            if p.fits is False or (p.fits is None and p.peak_mib is not None and p.peak_mib > device_mib)]
    if over:
        ax.axvspan(over[0] / 2 ** 0.5, max(xs) * 2 ** 0.5, color="#b2182b", alpha=0.07, linewidth=0)
        ax.text(over[0] / 2 ** 0.5, top * 0.90, f"out of memory from batch {over[0]} ({device_mib / 1024:.0f} GiB) ",
                color="#b2182b", fontsize=7, va="top", ha="right")
    if asked_batch is not None:
        asked = next((p for p in points if p.batch_size == asked_batch), None)
        if asked is not None:
            ax.annotate(f"batch {asked_batch}: {asked.samples_per_s:,.0f}/s", (asked_batch, asked.samples_per_s),
                        textcoords="offset points", xytext=(6, -12), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples / s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, out)
