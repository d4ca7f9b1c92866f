"""Cost models: per-op time for aten ops and per-phase predictions, each with its source."""

from gpemu.cost.roofline import op_bytes, op_flops, op_time_s

__all__ = ["op_bytes", "op_flops", "op_time_s"]
