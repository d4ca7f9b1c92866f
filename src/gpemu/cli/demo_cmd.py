"""CLI command `gpemu demo`: a real JPEG DataLoader feeding an emulated GPU, showing how workers change the stall."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpemu.errors import GpemuError
from gpemu.hardware import GPUSpec, get_gpu
from gpemu.paths import cache_dir

REPO_ROOT = Path(__file__).resolve().parents[3]  # src/gpemu/cli/demo_cmd.py -> repo root (editable install)
SHARED_PROFILES = REPO_ROOT.parent / "shared" / "data" / "gpemu-profiles"
IMAGENET_EXAMPLE = REPO_ROOT / "examples" / "imagenet" / "main.py"
N_CLASSES = 8
console = Console()


def _parse_workers(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as exc:
        raise GpemuError(f"--workers must be a comma-separated list of integers, got {text!r}") from exc
    if not workers or any(w < 0 for w in workers):
        raise GpemuError(f"--workers must list worker counts >= 0, got {text!r}")
    return workers


def default_workers() -> list[int]:
    """Return the worker counts the demo compares: 0 and 2, plus min(8, cores) when the machine has more than 2."""
    cores = os.cpu_count() or 1
    return [0, 2] + ([min(8, cores)] if cores > 2 else [])


def resolve_profile_db(spec: GPUSpec, model: str, tmp_dir: Path) -> tuple[Any, str]:
    """Return (profile DB or None, where the phase times come from): user DB, else ../shared/data, else cost model."""
    try:
        from gpemu.profiles import ProfileDB, import_gpemu
    except ImportError:
        return None, "cost model (no profile database installed)"
    db = ProfileDB.default()
    if db.has(spec.key, model):
        return db, "your profile database"
    if SHARED_PROFILES.is_dir():
        # Import only this GPU's folders: a temporary tree of symlinks into the shared data (nothing is copied).
        src = tmp_dir / "gpemu-tree"
        for folder in ("time/compute/forward", "time/compute/backward", "time/transfer", "memory"):
            base = SHARED_PROFILES / folder
            if not base.is_dir():
                continue
            for gpu_dir in base.iterdir():
                with contextlib.suppress(GpemuError):
                    if gpu_dir.is_dir() and get_gpu(gpu_dir.name).key == spec.key:
                        (src / folder).mkdir(parents=True, exist_ok=True)
                        (src / folder / gpu_dir.name).symlink_to(gpu_dir, target_is_directory=True)
        if src.is_dir():
            dest = tmp_dir / "profiles"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import_gpemu(src, dest_dir=dest)
            imported = ProfileDB.from_paths([dest])
            if imported.has(spec.key, model):
                return imported, f"GPEmu measurements imported from {SHARED_PROFILES}"
    return db, "PREDICTED by the cost model (no measured profile for this GPU/model)"


def _transform() -> Any:
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def run_explicit(
    spec: GPUSpec, model: str, batch_size: int, workers: list[int], iters: int, data_dir: Path | None,
    report_json: Path | None, quiet: bool = False, reports: list[tuple[str, dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Run the explicit-API demo for each worker count; return one summary dict per worker count (and append each
    whole report to `reports` when given)."""
    from torchvision.datasets import ImageFolder

    from gpemu.workloads.synthetic import make_jpeg_folder

    n_per_class = math.ceil((iters + 1) * batch_size / N_CLASSES)
    root = data_dir or (cache_dir() / f"demo-jpeg-{N_CLASSES}x{n_per_class}")
    with console.status(f"writing {N_CLASSES * n_per_class} synthetic JPEGs to {root} (reused when present)"):
        make_jpeg_folder(root, N_CLASSES, n_per_class)
    dataset = ImageFolder(str(root), transform=_transform())
    results: list[dict[str, Any]] = []
    # One intra-op thread in this process, as each DataLoader worker has: on a small, busy machine OpenMP's spinning
    # threads otherwise make in-process loading (workers=0) 10x slower (measured 3.5 s vs 0.25 s per batch of 32 at
    # load average 5 on 2 cores), which would compare OpenMP oversubscription rather than data pipelines.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run_explicit_configs(spec, model, batch_size, workers, iters, dataset, report_json, quiet, results, reports)
    finally:
        torch.set_num_threads(threads)
    return results


def _run_explicit_configs(
    spec: GPUSpec, model: str, batch_size: int, workers: list[int], iters: int, dataset: Any,
    report_json: Path | None, quiet: bool, results: list[dict[str, Any]],
    reports: list[tuple[str, dict[str, Any]]] | None = None,
) -> None:
    from torch.utils.data import DataLoader

    from gpemu.device.api import Emulator
    from gpemu.report import reporting, write_json

    with tempfile.TemporaryDirectory(prefix="gpemu-demo-") as tmp:
        db, provenance = resolve_profile_db(spec, model, Path(tmp))
        probe = Emulator(spec, db=db)
        fwd, bwd = (probe.estimate(model, p, batch_size) for p in ("forward", "backward"))
        console.print(
            f"[bold]gpemu demo[/] (explicit API): {spec.name} / {model} / batch {batch_size}; phase times from "
            f"{escape(provenance)}: forward {fwd.value * 1e3:.1f} ms ({fwd.kind}), backward {bwd.value * 1e3:.1f} ms "
            f"({bwd.kind}). Data: {len(dataset)} JPEGs decoded + RandomResizedCrop + flip + Normalize for real."
        )
        for w in workers:
            emu = Emulator(spec, db=db)
            loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=w, drop_last=True)
            with reporting(emu.devices) as rep, Progress(
                TextColumn(f"workers={w}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), console=console, transient=quiet,
            ) as progress:
                task = progress.add_task("", total=iters)
                for images, _labels in itertools.islice(loader, iters):  # never fetches batch iters + 1
                    emu.h2d(images.nbytes, pinned=True, non_blocking=True)  # pin_memory=True, non_blocking=True
                    emu.train_step(model, batch_size)
                    emu.synchronize()  # where a script reads loss.item()
                    win = rep.collector.iterations[-1]
                    data_ms = sum(b - a for a, b in win.fetches) * 1e3
                    progress.update(task, advance=1, description=f"last data wait {data_ms:6.1f} ms")
            report = rep.to_dict()
            _print_iterations(w, report["iterations"], quiet)
            summary = report["summary"]
            results.append({"workers": w, **summary})
            if reports is not None:
                reports.append((f"{w} DataLoader workers", report))
            if report_json is not None:
                write_json(report, report_json.with_name(f"{report_json.stem}-w{w}{report_json.suffix}"))


def _print_iterations(workers: int, rows: list[dict[str, Any]], quiet: bool) -> None:
    if quiet:
        return
    table = Table(
        title=f"workers={workers}: per iteration (ms)", show_edge=False, pad_edge=False,
        caption="* warm-up (left out of the summary)   ~ last iteration, closed at the final sync (left out)",
    )
    for col in ("it", "data wait", "H2D", "compute", "GPU idle", "fetch stall %"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['iteration']}{'*' if r['iteration'] == 0 else '~' if r['partial'] else ''}", f"{r['data_wait_s'] * 1e3:.1f}",
            f"{r['h2d_s'] * 1e3:.1f}", f"{r.get('gpu_work_s', r['gpu_busy_s']) * 1e3:.1f}", f"{r['gpu_idle_s'] * 1e3:.1f}",
            f"{r['fetch_stall_pct']:.0f}",
        )
    console.print(table)


def run_dropin(
    spec: GPUSpec, model: str, batch_size: int, workers: list[int], iters: int, data_dir: Path | None,
    reports: list[tuple[str, dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Run examples/imagenet/main.py through `gpemu run` per worker count; return one summary dict each (and append
    each whole report to `reports` when given)."""
    from gpemu.workloads.synthetic import make_imagenet_folder

    if not IMAGENET_EXAMPLE.is_file():
        raise GpemuError(f"--mode dropin needs {IMAGENET_EXAMPLE} (the drop-in example script); it is not there")
    n_per_class = math.ceil((iters + 1) * batch_size / N_CLASSES)
    root = data_dir or (cache_dir() / f"demo-imagenet-{N_CLASSES}x{n_per_class}")
    with console.status(f"writing synthetic JPEGs to {root} (reused when present)"):
        make_imagenet_folder(root, N_CLASSES, n_per_class, max(1, batch_size // N_CLASSES))
    results = []
    with tempfile.TemporaryDirectory(prefix="gpemu-demo-") as tmp:
        env = dict(os.environ)
        # One intra-op thread, as in explicit mode (see run_explicit): on a small machine OpenMP oversubscription
        # would otherwise dominate in-process loading. The emulated GPU does no arithmetic, so nothing else changes.
        env.setdefault("OMP_NUM_THREADS", "1")
        _db, where = resolve_profile_db(spec, model, Path(tmp))
        if where.startswith("GPEmu measurements"):
            env["GPEMU_PROFILE_DIR"] = str(Path(tmp) / "profiles")
        console.print(f"[bold]phase times:[/] {where}")
        for w in workers:
            out = Path(tmp) / f"w{w}.json"
            cmd = [sys.executable, "-m", "gpemu", "run", "--gpu", spec.key, "--model", model, "--report-json",
                   str(out), "--", sys.executable, str(IMAGENET_EXAMPLE), str(root), "-a", model, "-b",
                   str(batch_size), "-j", str(w), "--epochs", "1", "--iters", str(iters),
                   "--checkpoint", str(Path(tmp) / f"checkpoint-w{w}.pth.tar")]
            console.print(f"[bold]$[/] {' '.join(cmd[2:])}")
            code = subprocess.call(cmd, env=env)
            if code != 0 or not out.is_file():
                raise GpemuError(f"the drop-in run with {w} workers failed (exit code {code})")
            report = json.loads(out.read_text())
            results.append({"workers": w, **report["summary"]})
            if reports is not None:
                reports.append((f"{w} DataLoader workers", report))
    return results


def print_summary(results: list[dict[str, Any]]) -> None:
    """Print one row per worker count: mean iteration, data wait, H2D, compute, GPU busy % and fetch stall %."""
    table = Table(title="Summary (means over iterations after the warm-up ones each run report names above)")
    for col in ("workers", "iteration ms", "data wait ms", "H2D ms", "compute ms", "GPU busy %", "fetch stall %"):
        table.add_column(col, justify="right")
    for r in results:
        if "wall_s" not in r:
            table.add_row(str(r["workers"]), "-", "-", "-", "-", "-", "-")
            continue
        table.add_row(
            str(r["workers"]), f"{r['wall_s']['mean'] * 1e3:.1f}", f"{r['data_wait_s']['mean'] * 1e3:.1f}",
            f"{r['h2d_s']['mean'] * 1e3:.1f}", f"{r.get('gpu_work_s', r['gpu_busy_s'])['mean'] * 1e3:.1f}",
            f"{r['gpu_busy_pct']:.0f}", f"{r['fetch_stall_pct']:.0f}",
        )
    console.print(table)
    with_stall = [r for r in results if "fetch_stall_pct" in r]
    if len(with_stall) >= 2:
        a, b = with_stall[0], with_stall[-1]
        console.print(
            f"DataLoader workers {a['workers']} -> {b['workers']}: fetch stall {a['fetch_stall_pct']:.0f}% -> "
            f"{b['fetch_stall_pct']:.0f}%, GPU busy {a['gpu_busy_pct']:.0f}% -> {b['gpu_busy_pct']:.0f}%."
        )


def demo(
    mode: str = typer.Option("dropin", "--mode", help="explicit (Emulator API) or dropin (gpemu run + examples)."),
    gpu: str = typer.Option("v100", "--gpu", help="GPU to emulate."),
    model: str = typer.Option("resnet50", "--model", help="Profiled workload."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="Batch size."),
    workers: str = typer.Option(
        None, "--workers", help="Comma-separated DataLoader worker counts (default 0,2 plus min(8, cores) if > 2)."
    ),
    iters: int = typer.Option(12, "--iters", help="Iterations per worker count."),
    data_dir: Path = typer.Option(None, "--data-dir", help="Where to write the synthetic JPEGs (default: cache)."),
    report_json: Path = typer.Option(None, "--report-json", help="Write each run's report (explicit mode)."),
    plot: Path = typer.Option(None, "--plot", help="Draw every worker count's iterations side by side into this "
                              "image (.png/.svg/.pdf; needs matplotlib)."),
) -> None:
    """Show a real JPEG pipeline feeding an emulated GPU: per-iteration data wait / H2D / compute and fetch stall."""
    spec = get_gpu(gpu)
    if batch_size <= 0 or iters <= 0:
        raise GpemuError(f"--batch-size and --iters must be positive, got {batch_size} and {iters}")
    worker_counts = _parse_workers(workers) if workers else default_workers()
    reports: list[tuple[str, dict[str, Any]]] = []
    if mode == "explicit":
        results = run_explicit(spec, model, batch_size, worker_counts, iters, data_dir, report_json, reports=reports)
    elif mode == "dropin":
        results = run_dropin(spec, model, batch_size, worker_counts, iters, data_dir, reports=reports)
    else:
        from gpemu.errors import UnknownNameError

        raise UnknownNameError("demo mode", mode, ["explicit", "dropin"])
    print_summary(results)
    if plot is not None:
        from gpemu.report.plot import plot_reports

        written = plot_reports(reports, plot, f"gpemu demo: {spec.name}, {model}, batch {batch_size}, real JPEG "
                                              "decoding in the DataLoader")
        console.print(f"plot written to {written}")


def register(app: typer.Typer) -> None:
    """Add `gpemu demo` to the app."""
    app.command("demo")(demo)
