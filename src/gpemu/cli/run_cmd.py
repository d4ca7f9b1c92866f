"""CLI command `gpemu run`: run any command with the emulated GPU installed in its Python processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import typer

from gpemu.errors import GpemuError
from gpemu.hardware import get_gpu
from gpemu.units import parse_size

BOOT_DIR = Path(__file__).resolve().parents[1] / "_boot"


REAL_GPU = "real"


def build_env(
    gpu: str, count: int, model: str | None, trace: Path | None, report_json: Path | None, memory_limit: str | None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Return the child's environment: GPEMU_* settings and PYTHONPATH with the start-up hook first.

    `gpu="real"` runs on the machine's own GPU (nothing emulated) with only the run report, the reference side of
    `gpemu validate`."""
    key = REAL_GPU if gpu.strip().lower() == REAL_GPU else get_gpu(gpu).key  # unknown -> UnknownNameError
    if count < 1:
        raise GpemuError(f"--count must be >= 1, got {count}")
    env = dict(os.environ if base is None else base)
    env["GPEMU_GPU"] = key
    env["GPEMU_COUNT"] = str(count)
    for name, value in (("GPEMU_MODEL", model), ("GPEMU_TRACE", trace), ("GPEMU_REPORT_JSON", report_json)):
        if value:
            env[name] = str(Path(value).resolve()) if isinstance(value, Path) else str(value)
        else:
            env.pop(name, None)
    if memory_limit:
        env["GPEMU_MEMORY_LIMIT"] = str(parse_size(memory_limit))
    else:
        env.pop("GPEMU_MEMORY_LIMIT", None)
    paths = [str(BOOT_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # `python` in the command means the interpreter gpemu itself runs in (its venv), even when it is not activated.
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir)])
    return env


def run(
    ctx: typer.Context,
    gpu: str = typer.Option(..., "--gpu", help="GPU to emulate (e.g. v100, a100, h100; see `gpemu gpus`), or `real`: "
                            "run on this machine's own GPU with only the run report (for `gpemu validate`)."),
    count: int = typer.Option(1, "--count", help="Number of emulated GPUs (cuda:0..N-1)."),
    model: str = typer.Option(None, "--model", help="Profiled workload the script trains (e.g. resnet50)."),
    trace: Path = typer.Option(None, "--trace", help="Write a Perfetto/Chrome trace here at exit."),
    report_json: Path = typer.Option(None, "--report-json", help="Write every iteration of the run report as JSON."),
    memory_limit: str = typer.Option(None, "--memory-limit", help="Cap emulated device memory, e.g. 10GiB."),
    memory_report: bool = typer.Option(
        False, "--memory-report", help="At exit, print peak, persistent memory and the top allocations by module."
    ),
    plot: Path = typer.Option(None, "--plot", help="At exit, draw the run report's iterations into this image "
                              "(.png/.svg/.pdf; needs matplotlib; `gpemu plot` compares several reports)."),
) -> None:
    """Run COMMAND (after --) with emulated GPUs: e.g. gpemu run --gpu a100 -- python train.py --epochs 1."""
    command = list(ctx.args)
    if not command:
        raise GpemuError("no command given: use e.g. `gpemu run --gpu v100 -- python train.py`")
    tmp_report = None
    if plot is not None and report_json is None:  # the plot is drawn from the report: keep one for it
        tmp_report = Path(tempfile.mkdtemp(prefix="gpemu-run-")) / "report.json"
        report_json = tmp_report
    env = build_env(gpu, count, model, trace, report_json, memory_limit)
    if memory_report:
        env["GPEMU_MEMORY_REPORT"] = "1"
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError as exc:
        raise GpemuError(f"command not found: {command[0]!r}") from exc
    # Ctrl-C reaches the child through the terminal's process group; we just wait for it and pass its status on.
    # A SIGTERM sent to this process alone is passed on to the child (Note [Signals to the child]).
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    if plot is not None and report_json is not None:
        _plot_after_run(report_json, plot, " ".join(command))
        if tmp_report is not None:
            shutil.rmtree(tmp_report.parent, ignore_errors=True)
    raise typer.Exit(code if code >= 0 else 128 - code)


# Note [Signals to the child]: `gpemu run -- python train.py` stands where `python train.py` stood, so a SIGTERM sent to
# it alone (`kill PID`, a launcher's `Popen.terminate()`, a scheduler that signals the process it started) must stop
# the training as it stops a plain python run. `timeout 300 gpemu run ...` signals the whole process group and
# Ctrl-C reaches it through the terminal, but a SIGTERM to this process alone killed only it: the script ran on as an
# orphan and its run report stayed incomplete until the script ended on its own (lucidrains/x-transformers'
# train_enwik8.py has NUM_BATCHES = 100,000 fixed in the file, so a short run is one stopped by a signal). The signal
# is now passed on: the child's report hooks write its report (report/hooks.py, install) and it ends as SIGTERM
# ends it, and the exit status is the child's (143 for a death by SIGTERM, as the shell reports).


def _plot_after_run(report_json: Path, out: Path, command: str) -> None:
    """Draw the run's report into `out`; a missing report or matplotlib is one line on stderr, never a failed run."""
    from gpemu.report.plot import load_report, plot_reports

    if not report_json.is_file():
        print(f"gpemu: no run report at {report_json} to plot (the command ran no emulated GPU?)", file=sys.stderr)
        return
    try:
        written = plot_reports([("run", load_report(report_json))], out, command[:100])
    except GpemuError as exc:
        print(f"gpemu: no plot: {exc}", file=sys.stderr)
        return
    print(f"gpemu: plot written to {written}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    """Add `gpemu run` to the app."""
    app.command(
        "run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )(run)


