"""CLI command `gpemu plot`: draw run reports as per-iteration stacked bars (Note [Iteration plot])."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gpemu.report.plot import load_report, plot_reports

console = Console()


def plot(
    reports: list[Path] = typer.Argument(..., help="Run report JSON files (`gpemu run --report-json`), one panel "
                                                   "each, side by side."),
    out: Path = typer.Option(Path("gpemu-iterations.png"), "--out", "-o", help="Image to write (.png, .svg, .pdf)."),
    title: str = typer.Option(None, "--title", help="Title above the panels."),
) -> None:
    """Plot run reports: each iteration's wall time as GPU busy, GPU idle on data, and other idle time."""
    written = plot_reports([(p.stem, load_report(p)) for p in reports], out, title)
    console.print(f"plot written to {written}")


def register(app: typer.Typer) -> None:
    """Add `gpemu plot` to the app (once, however often it is called)."""
    if any(cmd.name == "plot" for cmd in app.registered_commands):
        return
    app.command("plot")(plot)
