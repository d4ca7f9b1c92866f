"""CLI commands over the GPU catalog and the profile database: gpus, models, import-gpemu, predict."""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpemu.errors import GpemuError

# Tables are wide: when stdout is not a terminal (a pipe, a file, a test) do not squeeze them to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
    return typer.Exit(2)


def gpus() -> None:
    """List the GPUs gpemu can emulate with their key figures."""
    from gpemu.hardware import list_gpus

    table = Table(title="gpemu GPU catalog (peaks are dense; see docs/gpus.md for sources)")
    for col in ("key", "name", "arch", "memory GiB", "FP32 TFLOPS", "FP16 TFLOPS", "HBM GB/s", "PCIe", "H2D GB/s"):
        table.add_column(col, justify="right" if col[0].isupper() or "GB" in col else "left")
    for spec in list_gpus():
        fp16 = spec.peak_tflops.get("fp16", 0.0)
        table.add_row(
            spec.key,
            spec.name,
            spec.arch,
            f"{spec.memory_gib:g}",
            f"{spec.peak_tflops['fp32']:g}",
            f"{fp16:g}" if fp16 else "-",
            f"{spec.memory_bw_gbps:g}",
            f"gen{spec.pcie_gen} x{spec.pcie_lanes}",
            f"{spec.h2d_pinned_gbps:g} / {spec.h2d_pageable_gbps:g}",
        )
    console.print(table)
    console.print("H2D GB/s = typical measured pinned / pageable host-to-device bandwidth.")


def models(gpu: str | None = typer.Option(None, "--gpu", "-g", help="Only this GPU (any alias).")) -> None:
    """List the workloads with profiles, per GPU, with their measured batch-size range."""
    from gpemu.hardware import get_gpu
    from gpemu.profiles import ProfileDB, user_profile_dir

    try:
        db = ProfileDB.default()
        keys = [get_gpu(gpu).key] if gpu else db.gpus()
    except GpemuError as exc:
        raise _fail(exc) from exc
    if not db.gpus():
        console.print(
            f"No profiles yet (looked in the package and in {user_profile_dir()}). "
            "Import some with `gpemu import-gpemu PATH`."
        )
        return
    table = Table(title="profiled workloads (measured batch sizes: first..last (how many))")
    for col in ("gpu", "model", "forward", "backward", "h2d", "memory", "phases"):
        table.add_column(col)
    rows = db.rows
    measured_rows = rows[rows["measured"] == 1]
    for key in keys:
        mine = measured_rows[measured_rows["gpu"] == key]
        for workload in sorted(set(rows[rows["gpu"] == key]["workload"])):
            sub = mine[mine["workload"] == workload]
            phases = sorted(set(rows[(rows["gpu"] == key) & (rows["workload"] == workload)]["phase"]))
            table.add_row(
                key,
                workload,
                _batch_range(sub, ("forward",)),
                _batch_range(sub, ("backward",)),
                _batch_range(sub, ("h2d_pageable",)),
                _batch_range(sub, ("mem_peak",)),
                ", ".join(phases),
            )
    if not table.row_count:
        console.print(f"No profiles for {keys[0]}; profiled GPUs: {', '.join(db.gpus())}")
        return
    console.print(table)


def _batch_range(rows: Any, phases: tuple[str, ...]) -> str:
    sizes = rows[rows["phase"].isin(phases)]["batch_size"]
    return f"{sizes.min()}..{sizes.max()} ({sizes.nunique()})" if len(sizes) else "-"


def import_gpemu_cmd(
    path: Path = typer.Argument(..., help="GPEmu's profiled_data folder (holding time/ and memory/)."),
    dest: Path | None = typer.Option(None, "--dest", help="Where to write (default: the user profile directory)."),
) -> None:
    """Import a GPEmu profile tree, tagging rows GPEmu filled in rather than measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gpemu.profiles import GpemuWarning, import_gpemu

    with (
        Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console)
        as bar,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always", GpemuWarning)
        task = bar.add_task("import", total=None)
        try:
            report = import_gpemu(path, dest, progress=lambda done, total: bar.update(task, completed=done, total=total))
        except GpemuError as exc:
            raise _fail(exc) from exc
    for w in caught:
        err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    table = Table(title=f"imported into {report.dest_dir}")
    for col in ("gpu", "rows", "measured", "filled by GPEmu"):
        table.add_column(col, justify="left" if col == "gpu" else "right")
    for key, counts in report.per_gpu.items():
        table.add_row(key, str(counts["rows"]), str(counts["measured"]), str(counts["filled"]))
    table.add_row("total", str(report.rows), str(report.measured), str(report.filled), style="bold")
    console.print(table)


def _fmt_seconds(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.6f}"


def predict(
    gpu: str = typer.Option(..., "--gpu", "-g", help="GPU key or alias (see `gpemu gpus`)."),
    model: str = typer.Option(..., "--model", "-m", help="Workload name (see `gpemu models`)."),
    batch_size: int = typer.Option(..., "--batch-size", "-b", help="Samples per batch (integer >= 1)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, tf32, fp16, bf16, amp or amp_bf16."),
    memory_format: str = typer.Option("nchw", "--memory-format",
                                      help="nchw, or channels_last (the model and input in NHWC, as after "
                                           "model.to(memory_format=torch.channels_last))."),
    seq_len: int = typer.Option(0, "--seq-len", help="Tokens per sample for a language model (default 512; "
                                                      "the same as --model gpt2@1024)."),
    mode: str = typer.Option("train", "--mode", help="train (one training step: forward, backward) or infer (one "
                                                     "inference forward: model.eval() under torch.no_grad())."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    plot: Path = typer.Option(None, "--plot", help="Also draw samples/s against the batch size (powers of two past "
                              "the memory limit, and --batch-size) into this image (needs matplotlib)."),
) -> None:
    """Predict per-phase seconds of one training step (forward, backward, input H2D) or inference forward, where each
    came from and how far that path has been off on held-out real measurements."""
    from gpemu.profiles import GpemuWarning
    from gpemu.profiles.step import predict_step

    if batch_size <= 0:
        raise _fail(GpemuError(f"--batch-size must be an integer >= 1, got {batch_size}"))
    if seq_len < 0:
        raise _fail(GpemuError(f"--seq-len must be an integer >= 1, got {seq_len}"))
    if seq_len:  # Note [Sequence length in the model name]
        from gpemu.workloads.models import split_seq_len

        model = f"{split_seq_len(model)[0]}@{seq_len}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GpemuWarning)
        try:
            out = predict_step(gpu, model, batch_size, dtype, memory_format=memory_format, mode=mode)
        except GpemuError as exc:
            raise _fail(exc) from exc
    for w in caught:
        if issubclass(w.category, GpemuWarning):
            err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    if as_json:
        print(json.dumps(out, allow_nan=False, default=str))
        return
    fmt = "" if memory_format == "nchw" else f", {memory_format}"
    fmt += "" if out.get("seq_len") is None else f", {out['seq_len']} tokens per sample"
    fmt += ", inference" if mode == "infer" else ""
    table = Table(title=f"{out['model']} on {out['gpu']}, batch {out['batch_size']}, {out['dtype']}{fmt}")
    for col in ("phase", "seconds", "source", "expected |error|", "from"):
        table.add_column(col)
    bases: dict[str, str] = {}
    for name, ph in out["phases"].items():
        err = ph.get("expected_error")
        trust = "-" if err is None else f"~{err['median_abs_pct']:.0f}% (p90 {err['p90_abs_pct']:.0f}%)"
        if err is not None:
            bases.setdefault(err["basis"], name)
        table.add_row(name, _fmt_seconds(ph.get("seconds")), ph["source"], trust, str(ph.get("provenance", "")))
    mem = out["memory"]
    if mem is not None:
        for key in ("peak_mib", "persistent_mib"):
            value = mem.get(key)
            table.add_row(key, "-" if value is None else f"{value:.1f} MiB", mem["source"], "-",
                          mem.get("provenance", ""))
    console.print(table)
    if mem is not None and mem.get("fits") is False:
        console.print(f"[bold red]does not fit[/]: the predicted peak ({mem['peak_mib']:,.0f} MiB allocated, plus the "
                      f"caching allocator's reserve and the CUDA context) exceeds {out['gpu']}'s memory; a real run "
                      "would raise CUDA out of memory", highlight=False)
    for basis in bases:  # See Note [Expected error] in gpemu/cost/expected_error.py
        console.print(f"expected |error| = median (p90) absolute error of this path on held-out real measurements: "
                      f"{basis}", highlight=False)
    bias = out.get("published_bias")
    if bias and any(ph["source"] != "measured" for ph in out["phases"].values()):  # Note [Published bias per GPU]
        lean = "faster" if bias["signed_median_pct"] > 0 else "slower"
        kind = {"vision": "image-model", "vision-inference": "image-model inference",
                "lm-pretrain": "LLM-pretraining"}.get(bias["model_kind"], "language-model")
        console.print(f"published real-GPU {kind} throughputs on {bias['gpu']}: {bias['rows']} rows, gpemu "
                      f"{abs(bias['signed_median_pct']):.0f}% {lean} than published (signed median; median |error| "
                      f"{bias['median_abs_pct']:.0f}%); shown, not corrected ({bias['basis']})", highlight=False)
    if plot is not None:
        _plot_sweep(out, plot)


SWEEP_MAX_BATCH = 4096


def sweep_batches(asked: int, fits: Callable[[int], bool]) -> list[int]:
    """Return the batch sizes of a predict sweep (Note [Batch sweep plot] in gpemu/report/plot.py): powers of two
    from 1 up to twice the asked batch, on while the batch still fits in memory (to SWEEP_MAX_BATCH) and one past it,
    and the asked batch."""
    batches, b = [], 1
    while b <= SWEEP_MAX_BATCH:
        batches.append(b)
        if b >= 2 * asked and not fits(b):
            break
        b *= 2
    return sorted({*batches, asked})


def _plot_sweep(out: dict[str, Any], path: Path) -> None:
    """Draw `gpemu predict --plot`: the asked prediction and its batch sweep (Note [Batch sweep plot])."""
    from gpemu.hardware import get_gpu
    from gpemu.profiles import GpemuWarning
    from gpemu.profiles.step import predict_step
    from gpemu.report.plot import plot_batch_sweep, sweep_point

    spec = get_gpu(out["gpu"])
    device_mib = spec.memory_bytes / 2**20
    cache: dict[int, dict[str, Any]] = {int(out["batch_size"]): out}

    def predicted(b: int) -> dict[str, Any]:
        if b not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", GpemuWarning)  # extrapolated rows are marked in the plot
                cache[b] = predict_step(spec, out["model"], b, out["dtype"], memory_format=out["memory_format"],
                                        mode=out["mode"])
        return cache[b]

    def fits(b: int) -> bool:
        memory = predicted(b).get("memory") or {}
        if memory.get("fits") is not None:
            return bool(memory["fits"])
        peak = memory.get("peak_mib")
        return peak is None or peak <= device_mib

    with console.status("predicting the batch sweep"):
        points = [sweep_point(predicted(b)) for b in sweep_batches(int(out["batch_size"]), fits)]
    what = "inference" if out["mode"] == "infer" else "training step"
    title = f"{out['model']} on {out['gpu']}, {out['dtype']}, {what} (gpemu predict)"
    try:
        written = plot_batch_sweep(points, device_mib, path, title, int(out["batch_size"]))
    except GpemuError as exc:
        raise _fail(exc) from exc
    console.print(f"plot written to {written}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app (once, however often it is called)."""
    if any(cmd.name == "gpus" for cmd in app.registered_commands):
        return
    app.command("gpus")(gpus)
    app.command("models")(models)
    app.command("import-gpemu")(import_gpemu_cmd)
    app.command("predict")(predict)
