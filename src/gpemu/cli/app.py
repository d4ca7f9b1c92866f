"""The `gpemu` Typer app: each command group lives in its own module and registers itself here."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from gpemu.errors import GpemuError

app = typer.Typer(
    name="gpemu",
    help="gpemu: emulate a GPU's timing, memory and concurrency for deep-learning systems research.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """gpemu: emulate a GPU's timing, memory and concurrency for deep-learning systems research."""


@app.command()
def version() -> None:
    """Print the gpemu version."""
    from gpemu import __version__

    print(__version__)


def _register() -> None:
    from gpemu.cli import catalog_cmds, demo_cmd, plot_cmd, profile_cmds, run_cmd

    for module in (catalog_cmds, run_cmd, profile_cmds, demo_cmd, plot_cmd):
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; user errors print one line and exit 2, never a traceback."""
    _register()
    try:
        app(args=argv, standalone_mode=True)
    except GpemuError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
