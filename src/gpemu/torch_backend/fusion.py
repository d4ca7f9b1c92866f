"""Compiled regions: the memory-bound ops of a torch.compile'd model priced as Inductor's fused kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Note [Compiled regions]
# Under emulation torch.compile returns the model itself (Note [torch.compile under emulation] in patches.py), so a
# compiled model runs, and used to be priced, op by op. On a GPU, Inductor fuses the chains of pointwise ops and
# reductions between its extern kernels (cuBLAS GEMMs, cuDNN convolutions, flash attention): a GELU written as
# tanh(sqrt(2/pi) * (x + 0.044715 x^3)) is one kernel reading x once, where eager runs eight, each reading and writing
# the whole tensor, and each paying a launch. The step of a compiled model is priced that way: inside the forward of
# a compiled top module, and in the backward pass of the autograd nodes that forward made (AOTAutograd compiles the
# backward graph too), consecutive ops of the streaming categories -- elementwise, norm (batch, layer and group
# norm, softmax; Inductor decomposes them), reduction, on-device copy (casts, cat, contiguous copies, gathers) -- form
# one group, priced at the most expensive op of the group: each op is charged what it adds to the group's running
# maximum (its own time, latency included, minus that maximum, never below zero; fuse_step), so a group costs one
# launch and one pass over its largest operands. Any other op (GEMM, convolution, attention, embedding, pooling,
# optimizer) ends the group and is priced as before. (Until session 11 this Note listed copies among the ops that
# end a group; FUSIBLE_CATEGORIES has fused them since session 9, as docs/drop-in.md says.)
# Regional compilation (each block compiled, not the model: `for b in model.blocks: b.compile()`, as torchtitan and
# diffusers' compile_repeated_blocks do) is priced the same way inside each compiled submodule's forward and the
# backward of its nodes; the ops between the blocks stay eager. Before session 9's fix only a compiled top module
# fused, so a regionally compiled GPT-2 124M step was priced as eager (79.1 ms; the whole model compiled: 71.4 ms).
# Phase calibration: profiles and phase predictions are eager steps; their scale corrects the per-op prices (host
# dispatch, the phase's fixed costs, the cost model's error on this model's kernels), and Inductor calls the same
# GEMM / convolution kernels. A compiled phase therefore takes the eager phase's time times its fused fraction:
# target x fused / unfused per-op sum, both sums from the last phase priced wholly per op (a recording, not a
# replay). Before the fix (session 9) calibration was off for compiled steps: timm's resnet50 (batch 32, AMP,
# channels_last, phase-predicted 35.5 ms eager) was priced at its fused per-op sum, 10.9 ms, 3.25x faster than eager,
# where its per-op sums say 17.1 -> 10.9 ms (1.57x).
# Only the compiled graph fuses: after the forward returns, an op is fused only while the autograd engine runs the
# backward of a node the compiled forward made (its sequence number lies between the two taken at the forward's start
# and end). The ops between the forward and the backward (a loss computed outside the model: timm's criterion, an
# LM's cross-entropy over the vocabulary), the backward of those eager ops, AccumulateGrad and the hooks that run on
# it (gradient accumulation's adds, DDP's bucket copies; its sequence number is UINT64_MAX), and what runs after the
# backward (GradScaler.unscale_, clip_grad_norm_) are eager kernels under Inductor too, priced one by one. Those of
# AccumulateGrad do not close the open group (the compiled backward is one autograd node on a GPU, and the
# AccumulateGrad nodes and their hooks, which the emulated engine interleaves with the compiled graph's ops, run after
# it); those of any other node do (the eager code between two compiled blocks). Before
# session 9's fix they joined the groups: nanoGPT's clip_grad_norm_ lost five kernels, and one-rank DDP's bucket copies
# half their time (0.37 instead of 0.78 ms per step on its small config).
# Stated, not fitted. Measured since session 11 against timm's published compiled (Inductor) inference throughputs,
# each beside its eager twin on the same GPU and PyTorch (bench/timm_compile_validation.py: 40 models x 4 files, RTX
# 4090 with PyTorch 2.4 and 2.9.1, RTX 5090, RTX PRO 6000 Max-Q; AMP, NCHW): the compiled / eager speed-up this rule
# gives is off by median 15.5 %, p90 29.5 %, signed median -5.9 % (published median 1.54-1.74x per file, gpemu's
# 1.35-1.40x). Where Inductor keeps the eager layout (ViT / DeiT / BEiT, Swin, CaiT, Mixer, LeViT, two RegNets; 56
# rows) median 7.9 %, signed +7.5 %: optimistic for groups Inductor splits (Swin and CaiT +20 %; a reduction followed
# by a broadcast over a different shape can be two kernels). Where it does not (104 rows of conv nets) the speed-up
# reads low, signed -19.4 %, ResNets -23 %, VGG-16 1.0x against 1.6-1.8x: Inductor's layout optimization
# (torch/_inductor/graph.py, GraphLowering.decide_layout_opt; for an inference graph, channels_last when its conv
# FLOPs weighted by Inductor's measured channels_last speed-ups are no more than the plain FLOPs) runs those models
# channels_last, and this rule keeps the eager layout. Pricing them channels_last (Note [Layout cost]) moves them to
# signed -12.3 % but widens their p90 from 32.7 to 40.3 % (DenseNets and the grouped-conv RegNetYs, whose NHWC
# convolutions gpemu prices too fast), so the rule keeps the layout; VGG-16 has nothing to fuse (fused fraction
# 0.997) and stays unexplained. Pooling is not made fusible: Inductor lowers small windows to Triton but realizes
# their input (x.realize_hint() in its pooling lowerings), so the producer's kernel stays. The rule ignores what the
# min-cut partitioner saves for backward or recomputes; no compiled training step is in the data. Published sign
# of the size: nanoGPT's README (karpathy/nanoGPT, "efficiency notes") reports torch.compile cutting GPT-2 124M
# training from ~250 to 135 ms per iteration on an A100; docs/drop-in.md gives the emulated eager and compiled
# steps of the same model.
FUSIBLE_CATEGORIES = frozenset({"elementwise", "norm", "reduction", "copy"})

_fusible_ops: dict[Any, bool] = {}
_ACCUMULATE_GRAD_SEQ = 2**64 - 1  # AccumulateGrad's sequence number (UINT64_MAX: the engine runs it first)


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


def marked_compiled(module: torch.nn.Module) -> bool:
    """Return True when torch.compile was applied to `module` itself (torch.compile(m) or m.compile())."""
    d = module.__dict__
    return bool(d.get("_gpemu_compiled")) or d.get("_compiled_call_impl") is not None


def compiled_module(module: torch.nn.Module) -> torch.nn.Module | None:
    """Return the module torch.compile was applied to: `module` itself, or the module a DataParallel /
    DistributedDataParallel wrapper holds; None when neither is compiled."""
    for m in (module, getattr(module, "module", None)):
        if isinstance(m, torch.nn.Module) and marked_compiled(m):
            return m
    return None


def fuse_step(group_s: float, op_s: float, fusible: bool) -> tuple[float, float, float]:
    """Return (charged_s, saved_s, group_s) for one op of a compiled region given its open group's maximum
    `group_s` (Note [Compiled regions]): an op that is not fusible closes the group and is charged in full; a fusible
    op is charged what it adds to the group's maximum, saves the rest, and raises the maximum to its own time."""
    if not fusible:
        return op_s, 0.0, 0.0
    extra = op_s - group_s
    if extra <= 0.0:
        return 0.0, op_s, group_s
    return extra, group_s, op_s


def fused_seconds(per_op_s: Sequence[float], fusible: Sequence[bool]) -> list[float]:
    """Return what each op of one compiled region (ops in launch order, their own seconds) is charged under Note
    [Compiled regions]: the per-op prices FusionGroups gives a forward whose ops all fuse by the same rule."""
    group_s = 0.0
    out = []
    for op_s, f in zip(per_op_s, fusible, strict=True):
        charged_s, _, group_s = fuse_step(group_s, op_s, f)
        out.append(charged_s)
    return out


class FusionGroups:
    """The running group of fusible ops of a compiled region (Note [Compiled regions])."""

    __slots__ = ("_group_s", "_ranges", "accumulating", "active", "fused_ops", "saved_s")

    def __init__(self) -> None:
        self.active = False
        # ops standing for AccumulateGrad's adds inside a replayed backward (Note [Adds of a replayed backward])
        self.accumulating = False
        self._group_s = 0.0
        # a backward region: the autograd sequence numbers [lo, hi) of the nodes each compiled forward made
        self._ranges: tuple[tuple[int, int], ...] = ()
        self.fused_ops = 0  # ops charged less than their own time (a report figure)
        self.saved_s = 0.0  # per-op time the groups saved since the phase tracker last reset it (calibration)

    def start(self, active: bool) -> None:
        """Begin a region (compiled or not) with no open group."""
        self.active = active
        self._ranges = ()
        self._group_s = 0.0

    def start_backward(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """Begin the backward region of compiled forwards whose autograd nodes got sequence numbers in the
        [lo, hi) `ranges`: only the ops of those nodes fuse (Note [Compiled regions])."""
        ranges = tuple(r for r in ranges if r[0] >= 0)  # -1: no node was made (inference mode), nothing to fuse
        self.start(bool(ranges))
        self._ranges = ranges

    def adjust(self, predicted_s: float, fusible: bool) -> float:
        """Return what one op adds to the step: its time, or for a fusible op what it adds to its group's maximum."""
        if self.accumulating:  # eager kernels that leave the open group open, as AccumulateGrad's
            return predicted_s
        if self._ranges:  # a backward region: only the nodes the compiled forwards made fuse
            node = torch._C._current_autograd_node()
            seq = -1 if node is None else node._sequence_nr()  # None: outside the backward pass
            if not any(lo <= seq < hi for lo, hi in self._ranges):
                if seq != _ACCUMULATE_GRAD_SEQ:  # an eager node between compiled regions ends the group
                    self._group_s = 0.0
                return predicted_s  # an eager kernel: its own time
        if fusible and self._group_s > 0.0:
            self.fused_ops += 1
        charged_s, saved_s, self._group_s = fuse_step(self._group_s, predicted_s, fusible)
        self.saved_s += saved_s
        return charged_s
