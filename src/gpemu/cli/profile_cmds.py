"""CLI commands: `gpemu profile` (measure a GPU), `gpemu profiles merge`, `gpemu validate` (real vs emulated)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpemu.errors import GpemuError

profiles_app = typer.Typer(help="Manage profile files (merge measured profiles into a profile directory).",
                           no_args_is_help=True)  # fmt: skip
console = Console()


def profile(
    models: str = typer.Option(..., "--models", help="comma-separated model names, e.g. resnet18,resnet50"),
    out: Path = typer.Option(..., "--out", help="output directory (an existing one is resumed)"),
    batch_sizes: str = typer.Option(
        None, "--batch-sizes", help='e.g. "1-256", "1,2,4", "pow2:1-256" [default: pow2:1-256; dry run: 1,2,4]'
    ),
    dtype: str = typer.Option("fp32", "--dtype", help="comma-separated: fp32, tf32, fp16, bf16, amp, amp_bf16"),
    gpu_index: int = typer.Option(0, "--gpu-index", help="CUDA device index"),
    warmup: int = typer.Option(5, "--warmup", min=0, help="untimed iterations before timing"),
    reps: int = typer.Option(20, "--reps", min=1, help="timed iterations (p10/p50/p90 over these)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="run on the CPU with fake timing (measured=0; for CI)"),
    ops: bool = typer.Option(True, "--ops/--no-ops", help="record per-op kernel times with torch.profiler"),
    op_batch_sizes: str = typer.Option(None, "--op-batch-sizes", help="only profile ops at these batch sizes"),
    transfers: bool = typer.Option(True, "--transfers/--no-transfers", help="measure H2D/D2H copies"),
    gpu_name: str = typer.Option(None, "--gpu-name", help="label rows with this GPU (catalog name) instead"),
    fake_memory_mib: float = typer.Option(None, "--fake-memory-mib", help="dry run: fake device memory (OOM test)"),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="skip configurations already in --out"),
    budget_s: float = typer.Option(None, "--budget-s", help="start no new configuration after this many seconds"),
) -> None:
    """Measure forward/backward/optimizer times, memory, copies and per-op times into native profile rows."""
    from gpemu.errors import GpemuError
    from gpemu.profiler.runner import ProfileConfig, Profiler
    from gpemu.profiler.sweep import parse_batch_sizes, parse_dtypes, parse_names
    from gpemu.profiler.workload import check_models

    if fake_memory_mib is not None and not dry_run:
        raise GpemuError("--fake-memory-mib only applies to --dry-run")
    model_list = parse_names(models)
    check_models(model_list)
    config = ProfileConfig(
        models=model_list,
        batch_sizes=parse_batch_sizes(batch_sizes or ("1,2,4" if dry_run else "pow2:1-256")),
        dtypes=parse_dtypes(dtype),
        out_dir=out,
        gpu_index=gpu_index,
        warmup=warmup,
        reps=reps,
        dry_run=dry_run,
        ops=ops,
        op_batch_sizes=set(parse_batch_sizes(op_batch_sizes)) if op_batch_sizes else None,
        transfers=transfers,
        gpu_name=gpu_name,
        memory_limit_mib=fake_memory_mib,
        resume=resume,
        deadline_s=time.monotonic() + budget_s if budget_s is not None else None,
    )
    profiler = Profiler(config)
    summary = profiler.run(show_progress=True)
    kind = ("dry-run (measured=0)" if dry_run else "emulated: gpemu's predictions (measured=0)"
            if profiler.prov.emulated else "measured")  # See Note [Profiling an emulated GPU]
    console.print(f"[bold]{summary.gpu_key}[/]: {len(summary.done)} configuration(s) profiled ({kind}), "
                  f"{len(summary.resumed)} already present, {summary.rows} rows -> {summary.profile_path}")  # fmt: skip
    for name, dt, batch in summary.oom:
        console.print(f"[yellow]out of memory[/]: {name} {dt} at batch {batch}; larger batches skipped")
    if summary.stopped_at_deadline:
        console.print("[yellow]budget spent[/]: run the same command again to resume")


@profiles_app.command("merge")
def merge(
    sources: list[Path] = typer.Argument(..., help="native profile CSVs or directories (e.g. a profile --out DIR)"),
    into: Path = typer.Option(None, "--into", help="profile directory [default: the user profile dir]"),
) -> None:
    """Add rows to a profile directory; newer measured rows replace older ones for the same key."""
    from gpemu.profiler.merge import merge_profiles

    report = merge_profiles(sources, into)
    console.print(f"merged into {report.into}: [green]{report.added} added[/], {report.replaced} replaced, "
                  f"{report.kept} kept (existing newer or measured), {report.unchanged} unchanged")  # fmt: skip
    for gpu, n in sorted(report.per_gpu.items()):
        console.print(f"  {gpu}: {n} row(s) added or replaced")


def validate(
    gpu_run: Path = typer.Option(..., "--gpu-run", help="run report of the script on a real GPU (JSON)"),
    emulated_run: Path = typer.Option(..., "--emulated-run", help="run report of the same script emulated (JSON)"),
    warmup: int = typer.Option(1, "--warmup", min=0, help="leading iterations to drop from both runs"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    plot: Path = typer.Option(None, "--plot", help="draw both runs' iterations side by side into this image "
                              "(Note [Iteration plot]; needs matplotlib)"),
) -> None:
    """Compare per-iteration times of a real-GPU run and an emulated run of the same script."""
    from gpemu.profiler.validate import compare_runs, load_iterations

    result = compare_runs(load_iterations(gpu_run), load_iterations(emulated_run), warmup)
    if plot is not None:  # both must be whole run reports; bare lists of times are compared but not drawn
        from gpemu.report.plot import load_report, plot_reports

        try:
            written = plot_reports(
                [("real GPU", load_report(gpu_run)), ("emulated", load_report(emulated_run))], plot,
                f"emulated vs real: median |error| per iteration {result.median_abs_error_pct:.1f}%")
            print(f"plot written to {written}", file=sys.stderr)
        except GpemuError as exc:
            print(f"no plot: {exc}", file=sys.stderr)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    table = Table(title=f"emulated vs real: {result.n_compared} iterations (first {warmup} dropped)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("median |error| per iteration", f"{result.median_abs_error_pct:.2f} %")
    table.add_row("p90 |error| per iteration", f"{result.p90_abs_error_pct:.2f} %")
    table.add_row("max |error| per iteration", f"{result.max_abs_error_pct:.2f} %")
    table.add_row("mean iteration, real", f"{result.mean_real_s * 1e3:.3f} ms")
    table.add_row("mean iteration, emulated", f"{result.mean_emulated_s * 1e3:.3f} ms")
    table.add_row("error of the mean", f"{result.mean_error_pct:+.2f} %")
    console.print(table)
    if result.n_real != result.n_emulated:
        console.print(f"[yellow]note[/]: the runs have {result.n_real} (real) and {result.n_emulated} (emulated) "
                      f"iterations; compared the first {result.n_compared} after warm-up")  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("profile")(profile)
    app.command("validate")(validate)
    app.add_typer(profiles_app, name="profiles")
