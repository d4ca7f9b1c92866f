"""Cost models: per-op time for aten ops and per-phase predictions, each with its source."""

from gpemu.cost.model import CostParams, load_params
from gpemu.cost.predict import predict_ops, predict_phase
from gpemu.cost.registry import CATEGORIES, OpCost, op_cost, register_cost
from gpemu.cost.roofline import op_bytes, op_flops, op_time_s

__all__ = [
    "CATEGORIES",
    "CostParams",
    "OpCost",
    "load_params",
    "op_bytes",
    "op_cost",
    "op_flops",
    "op_time_s",
    "predict_ops",
    "predict_phase",
    "register_cost",
]
