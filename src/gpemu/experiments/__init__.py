"""gpemu.experiments (see design.md)."""
