"""`python -m gpemu` runs the CLI."""

from gpemu.cli.app import main

main()
