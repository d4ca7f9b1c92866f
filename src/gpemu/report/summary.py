"""Run-report numbers: per-iteration rows, the summary over steady-state iterations, rich table and JSON file."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpemu.report.collector import RunCollector

REPORT_VERSION = 1

# Per-iteration time columns (seconds) and how the table labels them.
TIME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("wall_s", "iteration (wall)"),
    ("data_wait_s", "data wait (host blocked on the loader)"),
    ("h2d_s", "H2D copy engine busy"),
    ("gpu_busy_s", "GPU compute busy"),
    ("gpu_work_s", "GPU compute launched in it"),
    ("gpu_idle_s", "GPU idle"),
    ("gpu_idle_data_s", "  of which while host waited for data"),
    ("sync_wait_s", "host blocked on the GPU (syncs)"),
    ("emulator_s", "emulator's own host time"),
)
# A run is called bound by emulation when the emulator's own host time is at least this share of the iteration and
# the emulated GPU sat idle at least EMULATION_BOUND_IDLE of it: a real GPU's host would have kept it busier.
EMULATION_BOUND_SHARE = 0.5
EMULATION_BOUND_IDLE = 0.25


def iteration_rows(collector: RunCollector) -> list[dict[str, Any]]:
    """Return one dict per closed iteration: wall, data wait, H2D, GPU busy/idle (s) and busy / fetch-stall %."""
    rows: list[dict[str, Any]] = []
    devices = collector.devices
    n_dev = max(1, len(devices))
    origin = collector.iterations[0].start_s if collector.iterations else 0.0
    for win in collector.iterations:
        if win.end_s is None:
            continue
        t0, t1 = win.start_s, win.end_s
        wall = t1 - t0
        fetches = [(max(a, t0), min(b, t1)) for a, b in win.fetches]
        data_wait = max(0.0, sum(max(0.0, b - a) for a, b in fetches) - win.fetch_sync_s)  # Note [GPU waits inside a
        # fetch] in collector.py
        busy_per_dev, h2d_per_dev, idle_data_per_dev, work_per_dev = [], [], [], []
        for dev in devices:
            work_per_dev.append(win.launched_s.get((dev.index, "compute"), 0.0))
            compute = collector.logs.get((dev.index, "compute"))
            h2d = collector.logs.get((dev.index, "h2d"))
            busy = compute.busy_in(t0, t1) if compute else 0.0
            busy_per_dev.append(busy)
            h2d_per_dev.append(h2d.busy_in(t0, t1) if h2d else 0.0)
            busy_in_fetch = compute.busy_in_spans(fetches) if compute else 0.0
            idle_data_per_dev.append(max(0.0, data_wait - busy_in_fetch))
        gpu_busy = sum(busy_per_dev) / n_dev
        row: dict[str, Any] = {
            "iteration": win.index,
            "epoch": win.epoch,
            "start_s": t0 - origin,
            "wall_s": wall,
            "data_wait_s": data_wait,
            "h2d_s": sum(h2d_per_dev) / n_dev,
            "gpu_busy_s": gpu_busy,
            "gpu_work_s": sum(work_per_dev) / n_dev,
            "gpu_idle_s": max(0.0, wall - gpu_busy),
            "gpu_idle_data_s": sum(idle_data_per_dev) / n_dev,
            "sync_wait_s": win.sync_wait_end_s - win.sync_wait_start_s,
            "emulator_s": win.emulator_end[0] - win.emulator_start[0],
            "emulator_ops": win.emulator_end[1] - win.emulator_start[1],
            "recorded_calls": win.recorded_end - win.recorded_start,
            "h2d_bytes": win.h2d_bytes_end - win.h2d_bytes_start,
            "gpu_busy_pct": 100.0 * gpu_busy / wall if wall > 0 else 0.0,
            "fetch_stall_pct": 100.0 * data_wait / wall if wall > 0 else 0.0,
            "partial": win.partial,
            "train": win.trained,
        }
        if win.calls_start >= 0:
            row["module_calls"] = win.calls_end - win.calls_start
        if win.after_step_s or win.after_step_gpu_work_s:  # See Note [The last training step] in collector.py
            row["after_step_s"] = win.after_step_s
            row["after_step_gpu_work_s"] = win.after_step_gpu_work_s
        if len(devices) > 1:
            row["gpu_busy_s_per_device"] = busy_per_dev
        rows.append(row)
    return rows


# Note [Emulator warm-up]: the first training steps run every op through the per-op path while the replay path
# records them (replay.py, Note [Replay path]); from then on a step costs a fraction of the emulator's host time. Those
# recording steps are slow because of the emulator, not because of the script or the emulated GPU, so they are
# skipped like the script's own warm-up: after the fixed `warmup`, leading rows whose emulated-op count is more than
# REPLAY_WARMUP_OPS_RATIO times the median of the later rows of the same kind (training or evaluation), at most
# MAX_EMULATOR_WARMUP of them and only while MIN_STEADY_ROWS remain. A script that never replays keeps a steady op
# count and skips nothing extra. Every row stays in the JSON report.
# Note [Recording steps later on]: a model replays once two calls under one key (input shapes, train/eval, ...) ran
# alike; a later call under a new key (the next batch padded to a new length, a last smaller batch, a switch to
# evaluation) runs per op once more while it records. Such an iteration is slow because of the emulator, as the
# leading ones are, but it is not at the start: each iteration's row counts the calls the replay path recorded in it
# (`recorded_calls`), and when fewer than half of the steady rows recorded anything (replay is the steady state) and
# MIN_STEADY_ROWS remain, those rows are left out of the means and medians and the note says how many. A model that
# never replays records in every row and nothing is left out. Every row stays in the JSON report.
REPLAY_WARMUP_OPS_RATIO = 2.0
MAX_EMULATOR_WARMUP = 3
MIN_STEADY_ROWS = 3


def _emulator_warmup(rows: list[dict[str, Any]], warmup: int) -> int:
    """Return how many rows after `warmup` are the emulator's recording steps (see Note [Emulator warm-up])."""
    if any(not isinstance(r.get("emulator_ops"), int) for r in rows[warmup:]):  # rows from an older report
        return 0
    ops: list[tuple[int, bool]] = [(r["emulator_ops"], bool(r.get("train", True))) for r in rows[warmup:]]
    extra = 0
    while extra < MAX_EMULATOR_WARMUP and len(ops) - extra - 1 >= MIN_STEADY_ROWS:
        count, train = ops[extra]
        # compared with later rows of its own kind: a training step runs more ops than an evaluation batch
        # (facebookresearch/dlrm with --test-freq: 184 per step vs 42 per test batch, 80 of them), which made the
        # first three training steps "recording before replay" in a run that never replayed
        alike = [n for n, t in ops[extra + 1:] if t == train]
        if len(alike) < MIN_STEADY_ROWS or count <= REPLAY_WARMUP_OPS_RATIO * statistics.median(alike):
            break
        extra += 1
    return extra


# Note [Iterations with no GPU work]: a loop that probes its loader before each epoch (`b_sz =
# len(next(iter(loader))[0])`, pytorch/examples ddp-tutorial-series) opens an iteration at that fetch in which
# nothing runs on the device and no backward pass happens; it was counted as an "evaluation iteration (no backward
# pass)". A row with no backward, no GPU work (launched or running) and no emulated op is neither training nor
# evaluation: such rows are left out of the means and medians (while other rows remain) and the note counts them.
# Note [Windows without a model call]: with a prefetching loader (Note [Prefetching loaders] in collector.py) each
# epoch's first window holds only the prefetch's host-to-device copy and its normalisation kernels (~0.1 ms): no
# backward, so it counted as an evaluation iteration, and timm's train.py reported "evaluation iterations: 5, mean
# ... 0.1 ms GPU compute" for two epochs. In drop-in mode the report also counts module calls made outside a top
# module's forward (`module_calls`): a row with no backward pass and no module call ran no model, and is left out
# like a row with no GPU work.
def _empty(row: dict[str, Any]) -> bool:
    """Return True for a row with no backward pass and either no module call or no GPU work and no emulated op."""
    if row.get("train", True):
        return False
    if row.get("module_calls") == 0:  # See Note [Windows without a model call]
        return True
    return row.get("gpu_work_s") == 0.0 and row.get("gpu_busy_s") == 0.0 and row.get("emulator_ops") == 0


def summarize(rows: list[dict[str, Any]], warmup: int = 1) -> dict[str, Any]:
    """Return means/medians over steady-state rows: the first `warmup` and partial iterations are left out."""
    extra = _emulator_warmup(rows, warmup)
    steady = [r for r in rows[warmup + extra:] if not r["partial"]]
    note = f"first {warmup + extra} iteration(s) skipped as warm-up"
    if extra:
        note += f" ({extra} of them the emulator's own: per-op recording before replay)"
    if any(r["partial"] for r in rows[warmup + extra:]):
        note += "; partial last iteration excluded"
    later = [r for r in steady if r.get("recorded_calls", 0) > 0]  # See Note [Recording steps later on]
    if later and 2 * len(later) < len(steady) and len(steady) - len(later) >= MIN_STEADY_ROWS:
        steady = [r for r in steady if not r.get("recorded_calls", 0)]
        note += (f"; {len(later)} later iteration(s) left out: the emulator recorded them per op (a new input shape "
                 "or mode)")
    empty = [r for r in steady if _empty(r)]  # See Note [Iterations with no GPU work]
    if empty and len(empty) < len(steady):
        steady = [r for r in steady if not _empty(r)]
        note += f"; {len(empty)} iteration(s) with no GPU work or no model call left out"
    evaluation = [r for r in steady if not r.get("train", True)]
    split = bool(evaluation) and len(evaluation) < len(steady)  # training and evaluation loops: summarise training
    if split:
        steady = [r for r in steady if r.get("train", True)]
        note += f"; {len(evaluation)} evaluation iteration(s) (no backward pass) reported apart"
    if not steady:  # too short a run: use what there is, and say so
        steady = [r for r in rows if not r["partial"]] or rows
        note = "run too short to skip warm-up: all iterations used"
    cut = [r for r in rows if r.get("after_step_s")]  # See Note [The last training step] in collector.py
    if cut:
        note += (f"; {len(cut)} training iteration(s) ended at their last step when a new loader started "
                 f"({sum(r['after_step_s'] for r in cut):.3g} s after those steps, e.g. checkpointing, in no "
                 "iteration: after_step_s)")
    out: dict[str, Any] = {"iterations_total": len(rows), "iterations_used": len(steady), "note": note}
    if not steady:
        return out
    for key, _ in TIME_COLUMNS:
        if any(key not in r for r in steady):  # rows from an older report
            continue
        values = [float(r[key]) for r in steady]
        out[key] = {"mean": statistics.fmean(values), "median": statistics.median(values), "total": sum(values)}
    if split:
        out["evaluation"] = {"iterations": len(evaluation),
                             "wall_s": {"mean": statistics.fmean(float(r["wall_s"]) for r in evaluation)},
                             "gpu_work_s": {"mean": statistics.fmean(float(r.get("gpu_work_s", 0.0))
                                                                     for r in evaluation)}}
    wall_total = out["wall_s"]["total"]
    out["gpu_busy_pct"] = 100.0 * out["gpu_busy_s"]["total"] / wall_total if wall_total > 0 else 0.0
    out["fetch_stall_pct"] = 100.0 * out["data_wait_s"]["total"] / wall_total if wall_total > 0 else 0.0
    emu_share = out["emulator_s"]["total"] / wall_total if wall_total > 0 else 0.0
    idle_share = out["gpu_idle_s"]["total"] / wall_total if wall_total > 0 else 0.0
    out["emulation_bound"] = emu_share >= EMULATION_BOUND_SHARE and idle_share >= EMULATION_BOUND_IDLE
    return out


def report_dict(collector: RunCollector, warmup: int = 1, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the whole report (header, every iteration, summary) as a JSON-serialisable dict."""
    rows = iteration_rows(collector)
    devices = collector.devices
    by_timing = dict(collector.compute_s_by_timing)
    total = sum(by_timing.values())
    timing: dict[str, Any] = {
        "compute_s_by_source": by_timing,
        "calibrated_pct": 100.0 * by_timing.get("calibrated", 0.0) / total if total > 0 else 0.0,
    }
    meta = dict(meta or {})
    timing.update(meta.pop("timing", {}) or {})
    return {
        "version": REPORT_VERSION,
        "gpu": devices[0].spec.key if devices else None,
        "device_count": len(devices),
        "warmup_iterations": warmup,
        **meta,
        "timing": timing,
        "iterations": rows,
        "summary": summarize(rows, warmup),
    }


def write_json(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report atomically (temp file + rename) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def render(report: dict[str, Any], console: Console | None = None, title: str = "gpemu run report") -> None:
    """Print the summary table (ms per iteration and share of wall time) with rich."""
    console = console or Console(stderr=True)
    summary = report["summary"]
    if "wall_s" not in summary:
        console.print(f"[bold]{title}[/]: no iterations recorded (no DataLoader batch was fetched, no optimizer step ran, at most one backward pass).")
        return
    gpu = report.get("gpu") or "?"
    count = report.get("device_count", 1)
    table = Table(title=f"{title}: {count} x {gpu}, {summary['iterations_used']} of "
                  f"{summary['iterations_total']} iterations ({summary['note']})")
    table.add_column("per iteration")
    table.add_column("mean ms", justify="right")
    table.add_column("median ms", justify="right")
    table.add_column("% of wall", justify="right")
    wall_total = summary["wall_s"]["total"] or 1.0
    real = str(gpu).startswith("real ")  # `gpemu run --gpu real`: no device model, so no device columns
    for key, label in TIME_COLUMNS:
        if (real and key not in ("wall_s", "data_wait_s")) or key not in summary:
            continue
        stats = summary[key]
        table.add_row(label, f"{stats['mean'] * 1e3:.2f}", f"{stats['median'] * 1e3:.2f}",
                      f"{100.0 * stats['total'] / wall_total:.1f}")
    console.print(table)
    if real:
        console.print(f"fetch stall {summary['fetch_stall_pct']:.1f}%   (real GPU: device activity is not measured; "
                      "compare iteration times with `gpemu validate`)")
        return
    console.print(f"GPU busy {summary['gpu_busy_pct']:.1f}%   fetch stall {summary['fetch_stall_pct']:.1f}%")
    ev = summary.get("evaluation")
    if ev:
        console.print(f"evaluation iterations (no backward pass, left out above): {ev['iterations']}, mean "
                      f"{ev['wall_s']['mean'] * 1e3:.1f} ms wall, {ev['gpu_work_s']['mean'] * 1e3:.1f} ms GPU compute")
    line = timing_line(report.get("timing") or {})
    if line:
        console.print(line)
    if summary.get("emulation_bound"):
        console.print(
            f"[yellow]note[/]: this run is bound by the emulator's own host work ({summary['emulator_s']['median'] * 1e3:.1f}"
            f" of {summary['wall_s']['median'] * 1e3:.1f} ms per iteration, GPU idle {100 - summary['gpu_busy_pct']:.0f}%):"
            " a real GPU's host dispatches ops several times faster, so real iterations would be shorter and the GPU "
            "busier. Replayed steps (fixed shapes) cost far less; see docs/drop-in.md, 'Host overhead'.")


def timing_line(timing: dict[str, Any]) -> str:
    """Return one line saying where the emulated GPU times came from (measured profiles vs the cost model)."""
    by_source = timing.get("compute_s_by_source") or {}
    total = sum(by_source.values())
    if total <= 0:
        return ""
    model = timing.get("cost_model") or "the cost model"
    pct = float(timing.get("calibrated_pct", 0.0))
    phase_s = float(by_source.get("phase-predicted", 0.0))
    parts = []
    if pct > 0.0:
        profiles = timing.get("profiles") or {}
        which = " (" + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(profiles.items())) + ")" if profiles else ""
        parts.append(f"{pct:.0f}% calibrated to measured profiles{which}")
    if phase_s > 0.0:
        preds = timing.get("phase_predictions") or {}
        which = " (" + ", ".join(f"{k} {v[0] * 1e3:.1f} ms {v[1]}" + (
            f", expected |error| {v[2]}" if len(v) > 2 and v[2] else "") for k, v in sorted(preds.items())) + ")" if (
            preds) else ""
        parts.append(f"{100.0 * phase_s / total:.0f}% scaled to gpemu's phase predictions{which}")
    graph_s = float(by_source.get("cuda-graph", 0.0))
    if graph_s > 0.0:  # Note [CUDA graphs] in gpemu/device/graph.py
        parts.append(f"{100.0 * graph_s / total:.0f}% replayed from CUDA graphs at their captured per-op predictions")
    compiled = timing.get("compiled") or []
    fused = (f"; torch.compile'd {', '.join(compiled)}: pointwise/norm/reduction chains priced as fused kernels "
             "(Note [Compiled regions])") if compiled else ""
    lean = _published_lean(timing) if pct < 100.0 else ""
    if not parts:
        return (f"GPU time: all predicted per op by {model} (no measured profile or phase prediction matched){fused}"
                f"{lean}")
    if compiled:  # See Note [Compiled regions]: a compiled phase is not scaled to the eager target itself
        fused += ", its phases at the eager targets above times the fused / unfused per-op time"
    return f"GPU time: {'; '.join(parts)}; the rest predicted per op by {model}{fused}{lean}"


def _published_lean(timing: dict[str, Any]) -> str:
    """Return '. Published real-GPU throughputs on <gpu>: ...' for the run's GPU (Note [Published bias per GPU] in
    gpemu/cost/expected_error.py): how far gpemu's predictions were off there, per kind of model; shown, not
    applied."""
    biases = timing.get("published_bias") or []
    if not biases:
        return ""
    from gpemu.cost.expected_error import PUBLISHED_KIND_LABELS

    kinds = ", ".join(f"{PUBLISHED_KIND_LABELS.get(b['model_kind'], b['model_kind'])} gpemu "
                      f"{abs(b['signed_median_pct']):.0f}% {'faster' if b['signed_median_pct'] > 0 else 'slower'} "
                      f"({b['rows']} rows)" for b in biases)
    return (f". Published real-GPU throughputs on {biases[0]['gpu']} (signed medians, not corrected): {kinds}; "
            "docs/cost-model.md")
