"""Compiled regions: the memory-bound ops of a torch.compile'd model priced as Inductor's fused kernels."""

from __future__ import annotations

from typing import Any

import torch

# Note [Compiled regions]
# Under emulation torch.compile returns the model itself (Note [torch.compile under emulation] in patches.py), so a
# compiled model runs, and used to be priced, op by op. On a GPU, Inductor fuses the chains of pointwise ops and
# reductions between its extern kernels (cuBLAS GEMMs, cuDNN convolutions, flash attention): a GELU written as
# tanh(sqrt(2/pi) * (x + 0.044715 x^3)) is one kernel reading x once, where eager runs eight, each reading and writing
# the whole tensor, and each paying a launch. The step of a compiled model is priced that way: inside the forward of
# a compiled top module, and in the backward phase that follows it until the optimizer steps (AOTAutograd compiles
# the backward graph too), consecutive ops of the streaming categories -- elementwise, norm (batch, layer and group
# norm, softmax; Inductor decomposes them), reduction -- form one group, priced at the most expensive op of the group:
# each op is charged what it adds to the group's running maximum (its own time, latency included, minus that
# maximum, never below zero), so a group costs one launch and one pass over its largest operands. Any other op
# (GEMM, convolution, attention, embedding, pooling, copies, optimizer) ends the group and is priced as before.
# Phase calibration (profiles, phase predictions) is off for a compiled step: those are eager steps.
# Stated, not fitted: no measured Inductor step is in the data. It is optimistic for groups Inductor splits (a
# reduction followed by a broadcast over a different shape can be two kernels) and ignores what the min-cut
# partitioner saves for backward or recomputes. Published sign of the size: nanoGPT's README (karpathy/nanoGPT,
# "efficiency notes") reports torch.compile cutting GPT-2 124M training from ~250 to 135 ms per iteration on an A100;
# docs/drop-in.md gives the emulated eager and compiled steps of the same model.
FUSIBLE_CATEGORIES = frozenset({"elementwise", "norm", "reduction", "copy"})

_fusible_ops: dict[Any, bool] = {}


def op_fusible(func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Return True for an aten op Inductor would fuse with its neighbours (streaming categories), cached per op."""
    known = _fusible_ops.get(func)
    if known is None:
        try:
            from gpemu.cost.registry import op_cost

            known = op_cost(func, args, kwargs, out).category in FUSIBLE_CATEGORIES
        except Exception:  # no cost function: priced alone
            known = False
        _fusible_ops[func] = known
    return known


def is_compiled(module: torch.nn.Module) -> bool:
    """Return True when torch.compile was applied to `module` (torch.compile(m) or m.compile()), or to the module a
    DataParallel / DistributedDataParallel wrapper holds."""
    for m in (module, getattr(module, "module", None)):
        if isinstance(m, torch.nn.Module) and (m.__dict__.get("_gpemu_compiled")
                                                or m.__dict__.get("_compiled_call_impl") is not None):
            return True
    return False


class FusionGroups:
    """The running group of fusible ops of a compiled region (Note [Compiled regions])."""

    __slots__ = ("_group_s", "active", "fused_ops")

    def __init__(self) -> None:
        self.active = False
        self._group_s = 0.0
        self.fused_ops = 0  # ops charged less than their own time (a report figure)

    def start(self, active: bool) -> None:
        """Begin a region (compiled or not) with no open group."""
        self.active = active
        self._group_s = 0.0

    def adjust(self, predicted_s: float, fusible: bool) -> float:
        """Return what one op adds to the step: its time, or for a fusible op what it adds to its group's maximum."""
        if not fusible:
            self._group_s = 0.0
            return predicted_s
        extra = predicted_s - self._group_s
        if self._group_s > 0.0:
            self.fused_ops += 1
        if extra <= 0.0:
            return 0.0
        self._group_s = predicted_s
        return extra
