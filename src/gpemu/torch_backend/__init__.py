"""gpemu.torch_backend (see design.md)."""
