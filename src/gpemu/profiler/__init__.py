"""gpemu.profiler (see design.md)."""
