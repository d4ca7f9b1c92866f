"""gpemu.workloads (see design.md)."""
