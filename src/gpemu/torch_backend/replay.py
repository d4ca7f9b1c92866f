"""Whole-module replay: record a top-level module's forward and backward once, then charge later steps as one unit.

Note [Replay path]: the per-op path costs tens of microseconds of host CPU per aten op, i.e. tens of milliseconds
per training step, which a fast GPU would not give the script. Once the top module (the one PhaseTracker calls
"the model") has been called twice with the same key — module, train/eval, grad mode, autocast dtype, input
metadata and parameter set — and both calls recorded the same op signature (op names and predicted costs of the
forward, of the module's part of the backward, and the same memory deltas), later calls with that key run as one
custom autograd.Function over (inputs, *parameters) that
- charges the recorded forward costs as a few large work items (through PhaseTracker, so calibration still applies),
  with trace args {"replay": true};
- allocates the recorded saved-activation bytes (held until backward, or until the graph dies) and briefly the
  forward's transient peak, so memory_allocated and its peak follow the per-op path;
- returns output EmuTensors with the recorded metadata;
- in backward, charges the recorded backward costs, briefly allocates the backward's transient peak, and gives a
  gradient EmuTensor to every input and parameter that requires grad (see Note [Direct gradients]; AccumulateGrad's
  own ops are excluded from the recording and still run per op).
Replay falls back to the per-op path (and records anew) when the key changes (batch size, input shape, train/eval,
parameters), when any module hook or another global module hook is registered, for DDP/FSDP wrappers (their
forward must reach the communication library), and never replays a call whose
recording saw something it cannot reproduce: host syncs other than value reads in forward (Note [Replay with host
reads]), copies, work on other streams or devices, outputs that alias inputs or parameters (an input returned itself
replays: Note [Inputs returned]), or outputs that are not emulated tensors. GPEMU_REPLAY=0 (or install(replay=False)) disables it.

Note [Replay with host reads]: models read values back in forward on a real GPU too, and branch on them:
nn.TransformerEncoder's causal-mask check (`bool((mask == causal).all())`), transformers' `padding_mask.all()`
before dropping an all-ones attention mask. A recording with such reads (device-to-host copies through
ops.device_to_host) is replayable: the replayed forward charges the recorded ops up to each read, then the read's
copy and the host's wait for it (the same stall a GPU has), then the rest. What was read must not change the path,
so it must be the same on the replayed call: a read of a value gpemu does not know (the model's math) always reads
the same default; a read of a known value depends on the host copies it was computed from (ops.known_sources, Note
[Known values through small ops] in ops.py). Constants and module buffers are the same on every call; for inputs of
the call that a read depended on, what the read reads for this call's input values joins the replay key: the reads
are recomputed on the host from those values (Note [Read programs] in ops.py), or, when one cannot be, the digest of
the values themselves does. So a forward that asks whether its attention mask is all ones replays whether the mask is
fixed or pads differently every batch (each answer has its own recording), and a recording whose forward read more
or other values than its key promised is never replayed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as _nn_module
from torch.utils._pytree import tree_flatten, tree_unflatten

from gpemu.cost.roofline import fp32_math_modes as _fp32_math_modes
from gpemu.device.allocator import SMALL_SIZE_BYTES, round_size
from gpemu.torch_backend import ops as emu_ops
from gpemu.torch_backend import state
from gpemu.torch_backend import tensor as emu_tensor
from gpemu.torch_backend.tensor import META, EmuTensor, block_sizes, fresh, fresh_block, fresh_on, meta_nbytes

_ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
_ADDS = frozenset({"add.Tensor", "add_.Tensor"})  # the engine's sums of gradients: Note [Gradient sums across calls]
_cuda_backends = torch.backends.cuda
_will_execute = torch._C._will_engine_execute_node  # See Note [Direct gradients]
# Note [Tensor attributes from Python]: every tensor attribute read from Python on a tensor subclass (`p.grad`,
# `p.requires_grad`, `p._backward_hooks`, `t.shape`) first looks up the subclass' `__torch_function__` (~0.2-0.3 us:
# 3-4x the read itself). EmuTensor disables __torch_function__, so under DisableTorchFunctionSubclass (which skips
# that look-up) the same reads give the same values; the replay path's loops over every parameter run under it.
# Never around user code: orig(module, ...) runs outside it.
_plain_attrs = torch._C.DisableTorchFunctionSubclass
_QUEUE_WAIT = "launch queue full"
# wrappers whose forward talks to a communication library (DDP's reducer must see every forward): always per op
_NEVER_REPLAY = frozenset({"DistributedDataParallel", "FullyShardedDataParallel"})
MEMORY_SLACK_BYTES = 4 * 2**20
MEMORY_SLACK_FRACTION = 0.02
MAX_CHUNKS = 4  # work items per replayed phase: enough to show the phase's shape, few enough to be cheap


def replay_enabled_from_env() -> bool:
    """Return False when GPEMU_REPLAY is set to 0/false/no/off, else True."""
    return os.environ.get("GPEMU_REPLAY", "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class Chunk:
    """Consecutive recorded ops charged as one work item."""

    name: str
    predicted_s: float
    category: str
    ops: int


@dataclass
class Recording:
    """What one call of a top module did: costs, memory deltas and output metadata."""

    index: int
    stream_id: int
    fwd: list[tuple[str, float, str]] = field(default_factory=list)
    bwd: list[tuple[str, float, str]] = field(default_factory=list)
    saved_bytes: int = 0  # held from the end of forward to the end of backward
    # the requested bytes of each allocation saved_bytes is made of, in allocation order; None: one block of
    # saved_bytes (Note [Saved activations as allocated])
    saved_sizes: tuple[int, ...] | None = None
    fwd_transient_bytes: int = 0  # forward peak above the level at forward's end
    bwd_peak_bytes: int = 0  # backward peak above the level at backward's start
    out_spec: Any = None
    # non-tensor output leaves by position: a constant returned as recorded, or a type built empty (Note [Output
    # objects]); tensor leaves fill the other positions in order
    out_other: dict[int, tuple[bool, Any]] = field(default_factory=dict)
    # output leaves that are an input tensor itself, by position: the input's position (Note [Inputs returned])
    out_inputs: dict[int, int] = field(default_factory=dict)
    out_meta: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, bool]] = field(default_factory=list)
    # None when every output tensor owns a fresh storage; else ((bytes, dtype) per output storage, (storage, offset) per
    # output): Note [Outputs sharing a storage]
    out_layout: tuple[tuple[tuple[int, torch.dtype], ...], tuple[tuple[int, int], ...]] | None = None
    in_meta: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = field(default_factory=list)
    # value ranges of the output tensors, in order (empty: none had one): Note [Ranges through replay]
    out_ranges: tuple[tuple[int, int] | None, ...] = ()
    ok: bool = True
    bwd_started: bool = False
    done: bool = False
    fwd_chunks: list[Chunk] = field(default_factory=list)
    bwd_chunks: list[Chunk] = field(default_factory=list)
    grad_plans: dict[Any, _GradPlan] = field(default_factory=dict)  # by (needs_input_grad, direct pattern)
    # host reads in forward: (ops charged before it, bytes, reason); See Note [Replay with host reads]
    reads: list[tuple[int, int, str]] = field(default_factory=list)
    read_sources: set[int] = field(default_factory=set)
    # reads of known values: (how it was computed, the value read, its sources); See Note [Read programs] in ops.py
    value_reads: list[tuple[emu_ops.HostExpr | None, torch.Tensor, frozenset[int]]] = field(default_factory=list)
    # host-to-device copies in forward: (ops charged before it, bytes, pinned, non_blocking); Note [Copies in forward]
    copies: list[tuple[int, int, bool, bool]] = field(default_factory=list)
    copy_sources: set[int] = field(default_factory=set)  # the emulated tensors those copies made
    copied_hosts: set[int] = field(default_factory=set)  # host storages those copies read: Note [Host tensor arguments]
    fwd_segments: list[tuple[list[Chunk], tuple[Any, ...] | None]] = field(default_factory=list)
    n_params: int = 0
    fwd_only: bool = False  # its graph died without a backward: Note [Forwards without backward]
    stale: bool = False  # a forward-only recording whose replay got a backward: record again
    bwd_state: bool = False  # _grads_exist when the backward started (Note [Gradient accumulation])
    bwd_peaks: dict[bool, int] = field(default_factory=dict)  # bwd_peak_bytes by bwd_state, once ready
    plain_backwards: int = 0  # replayed backwards that gave every parameter its .grad (Note [Detached parameters])
    seq_lo: int = -1  # the first autograd sequence number of its forward (Note [Top modules in sequence])
    twice: bool = False  # its backward was differentiated again (create_graph): Note [Double backward]

    def matches(self, other: Recording) -> bool:
        """Return True when both calls ran the same ops at the same predicted costs with about the same memory."""
        if (self.fwd, self.bwd, self.out_meta, self.out_layout, self.stream_id, self.reads, self.copies,
                self.out_inputs, self.out_ranges) != (other.fwd, other.bwd, other.out_meta, other.out_layout,
                                                      other.stream_id, other.reads, other.copies, other.out_inputs,
                                                      other.out_ranges):
            return False
        # the caching allocator hands out whole blocks depending on what is cached, so byte counts move a little
        # from call to call (~0.5% on resnet18); a changed model moves them far more
        pairs = [(self.saved_bytes, other.saved_bytes), (self.fwd_transient_bytes, other.fwd_transient_bytes)]
        if self.bwd_state == other.bwd_state:  # See Note [Gradient accumulation]
            pairs.append((self.bwd_peak_bytes, other.bwd_peak_bytes))
        return all(abs(a - b) <= max(MEMORY_SLACK_BYTES, MEMORY_SLACK_FRACTION * max(a, b)) for a, b in pairs)


@dataclass
class _Entry:
    last: Recording | None = None
    ready: Recording | None = None
    siblings: dict[Any, _Entry] | None = None  # the module's entries under other keys: Note [New shapes]
    tried: Recording | None = None  # the latest recording made under this key: Note [Forwards that never replay]
    before_last: Recording | None = None  # the recording before `last`: Note [Alternating backwards]
    twice: bool = False  # a call under this key had its backward differentiated again: Note [Double backward]


class _Window:
    """Measures memory and side effects on one device between open and close (allocator peak restored after)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.allocator = device.allocator
        self.start = self.allocator.memory_allocated()
        self.mark = self.allocator.handle_mark()
        self.token = self.allocator.begin_peak_window()
        self.effects = _effects(device)
        self.workspace_bytes = self.allocator.workspace_bytes

    def close(self) -> tuple[int, int]:
        """Return (bytes allocated at close, peak allocated inside the window), less any library workspace the window
        created (the first GEMM's cuBLAS workspace stays for the process, not for the module: Note [Library
        workspaces] in gpemu.memory.workspaces); restore the running peak."""
        made = self.allocator.workspace_bytes - self.workspace_bytes
        end = self.allocator.memory_allocated()
        return end - made, self.allocator.end_peak_window(self.token) - made

    def clean(self, charged: int, reads: list[tuple[int, int, str]] | None = None,
              copies: list[tuple[int, int, bool, bool]] | None = None) -> bool:
        """Return True when the window saw exactly `charged` work items and no copies or host syncs but `reads`
        (recorded host reads: one D2H copy each, and the host's waits for them) and `copies` (recorded H2D copies:
        one copy each, and the waits of pageable or blocking ones)."""
        before = self.effects
        after = _effects(self.device)
        if not reads and not copies:
            return after[0] - before[0] == charged and after[1:] == before[1:]
        reads, copies = reads or [], copies or []
        return (after[0] - before[0] == charged + len(reads) + len(copies)
                and after[1] - before[1] == sum(c[1] for c in copies)
                and after[2] - before[2] == sum(r[1] for r in reads))


def _effects(device: Any) -> tuple[int, int, int, float]:
    stats = device.stats
    waits = sum(v for k, v in stats.host_wait_s.items() if k != _QUEUE_WAIT)
    return sum(stats.work_count.values()), stats.h2d_bytes, stats.d2h_bytes, waits


def _chunks(ops: list[tuple[str, float, str]], phase: str) -> list[Chunk]:
    """Return `ops` grouped into at most MAX_CHUNKS consecutive runs of one category."""
    if not ops:
        return []
    per = max(1, -(-len(ops) // MAX_CHUNKS))
    out: list[Chunk] = []
    for i, (name, predicted_s, category) in enumerate(ops):
        last = out[-1] if out else None
        if last is not None and last.category == category and last.ops < per:
            last.predicted_s += predicted_s
            last.ops += 1
            last.name = f"replay {phase}: {last.name.split(': ', 1)[1].split(' .. ')[0]} .. {name}"
        else:
            out.append(Chunk(f"replay {phase}: {name}", predicted_s, category, 1))
        del i
    return out


def _segments(rec: Recording) -> list[tuple[list[Chunk], tuple[Any, ...] | None]]:
    """Return the forward as (chunks, transfer after them or None) runs split at the recorded host reads ("read",
    bytes, reason) and host-to-device copies ("h2d", bytes, pinned, non_blocking), in the order they ran."""
    events = sorted([(pos, 0, ("read", nbytes, reason)) for pos, nbytes, reason in rec.reads]
                    + [(pos, 1, ("h2d", nbytes, pinned, nb)) for pos, nbytes, pinned, nb in rec.copies],
                    key=lambda e: e[0])  # stable: at one position, the order each list holds (see _copy)
    out: list[tuple[list[Chunk], tuple[Any, ...] | None]] = []
    start = 0
    for pos, _kind, event in events:
        out.append((_chunks(rec.fwd[start:pos], "forward"), event))
        start = pos
    out.append((_chunks(rec.fwd[start:], "forward"), None))
    return out


def _digest(value: torch.Tensor | None) -> Any:
    """Return a hashable digest of a host value (None for None)."""
    if value is None:
        return None
    flat = value.reshape(-1).contiguous()
    return (value.dtype, tuple(value.shape), hash(flat.view(torch.uint8).numpy().tobytes()))


def _value_digest(t: torch.Tensor) -> Any:
    """Return a hashable digest of `t`'s host-known value (None when gpemu does not know it)."""
    return _digest(emu_ops.known_value(t))


@dataclass
class _ReadProgram:
    """The host reads of a top module's forward that depend on its inputs' values, as expressions of those values:
    a call is keyed by what they read for its inputs (Note [Read programs] in ops.py), or by the inputs' values
    themselves when a read cannot be recomputed."""

    positions: tuple[int, ...]  # the inputs whose host values the reads depend on
    bound: tuple[emu_ops.HostExpr, ...] | None  # their expressions at recording (None: not recomputable)
    reads: tuple[emu_ops.HostExpr, ...] | None

    def key(self, inputs: list[torch.Tensor]) -> tuple[Any, ...]:
        """Return the part of the replay key that this call's input values decide."""
        if self.bound is not None and self.reads is not None:
            values = [emu_ops.known_value(inputs[i]) for i in self.positions]
            if all(v is not None for v in values):
                bound = {id(e): v for e, v in zip(self.bound, values, strict=True) if v is not None}
                memo: dict[int, Any] = {}
                try:
                    return ("reads", tuple(_digest(r.evaluate(bound, memo)) for r in self.reads))
                except Exception:  # an op the CPU refuses on these values: key by the inputs
                    pass
        return ("inputs", tuple(_value_digest(inputs[i]) for i in self.positions))


def _charge_chunks(emu: Any, index: int, chunks: list[Chunk]) -> None:
    emu.phases.replayed = True  # its per-op sums are not the phase's (Note [Compiled regions] in fusion.py)
    items = []
    for c in chunks:
        duration_s, args = emu.phases.charge(c.predicted_s)
        items.append((duration_s, c.name, c.category, {**args, "replay": True, "ops": c.ops}, c.ops))
    emu.current_stream(index).enqueue_many(items)  # one host wait at most: Note [Batched launches] in timeline.py


# Note [Forwards without backward]: an evaluation loop that keeps grad enabled (no `torch.no_grad()`, as
# pytorch/examples vision_transformer's) builds a graph every call and drops it without a backward, so its recording,
# which waits for the backward that completes it, never finished and the loop never replayed. A hook on the output
# lives as long as the output's graph (the grad_fn holds it); when the graph dies before that hook ran, the recording
# is finished as forward-only, and two such calls under one key make it replayable like any other. Every output that
# requires grad carries the hook (Note [First gradient]), so any backward into the call's graph passes through one.
# In training mode the inference is made only when the recorded forward changed no buffer of the module (no version
# counter moved): batch norm's running statistics and counters are updated by a training forward, which a replay
# does not do. Reinforcement-learning loops pick actions this way, in training mode with grad on and the output read
# with `.cpu()`: CleanRL's dqn.py (`q_network(obs)`, one output) and sac_continuous_action.py (`actor(x)` in
# `get_action`, two outputs: mean and log-std) recorded every action-selection call per op while the inference was
# made only in eval mode and for a single output (a rule from before every output carried the hook), and SAC's run
# report left a third of its iterations out as "recorded per op". If a forward-only replay ever gets a backward (a key first seen
# without one, then trained), its backward kernels are not known: gpemu warns once, that step's backward charges
# nothing, and the key records again.
def _buffer_versions(module: torch.nn.Module) -> tuple[int, ...]:
    """Return the version counters of `module`'s buffers: a forward that bumps one updated it (Note [Forwards without
    backward])."""
    with _plain_attrs():  # See Note [Tensor attributes from Python]
        return tuple(b._version for b in module.buffers() if not b.is_inference())


def _saved_sizes(allocator: Any, mark: int, outputs: list[Any], added_bytes: int) -> tuple[int, ...] | None:
    """Return the requested bytes of each allocation a recorded forward left live besides its outputs, in order;
    None when the forward's live allocations do not make up the `added_bytes` it added (Note [Saved activations as
    allocated])."""
    out_handles = {emu_tensor.storage_handle(t) for t in outputs}
    if 0 in out_handles:
        return None
    live = allocator.live_since(mark)
    if sum(size for _h, _req, size in live) != added_bytes or not out_handles <= {h for h, _req, _size in live}:
        return None
    sizes = [req for h, req, _size in live if h not in out_handles and req > SMALL_SIZE_BYTES]
    # the small-pool ones (batch norm's saved statistics, scalars) as few small-pool blocks of their rounded bytes:
    # they share 2 MiB segments either way, and one block per tensor costs host time per replay
    small = 0
    for h, req, size in live:
        if h not in out_handles and req <= SMALL_SIZE_BYTES:
            if small + size > SMALL_SIZE_BYTES:
                sizes.append(small)
                small = 0
            small += size
    if small:
        sizes.append(small)
    return tuple(sizes)


class _Sentinel:
    """An object whose death says that the autograd graph holding it died."""

    __slots__ = ("__weakref__",)


def _warn_once(replayer: Any, flag: str, message: str) -> None:
    """Warn `message` the first time `flag` (an attribute of the Replayer) is raised."""
    if replayer is not None and not getattr(replayer, flag):
        setattr(replayer, flag, True)
        warnings.warn(message, stacklevel=4)


def _warn_fwd_only(replayer: Any) -> None:
    _warn_once(replayer, "warned_fwd_only", "gpemu: a forward replayed as evaluation-only (its recorded calls had no "
               "backward) got a backward; that backward's kernels were not charged, and later calls record again "
               "(Note [Forwards without backward] in replay.py)")


# Note [Double backward]: a call whose backward is itself differentiated (torch.autograd.grad(..., create_graph=True):
# WGAN-GP's gradient penalty on the critic's interpolated input, R1 penalties, physics-informed losses) cannot replay:
# a replayed backward charges recorded costs and returns new gradient tensors with no graph behind them, so the
# backward through it (WGAN-GP: 29 kernels through the critic's three linears) would be neither charged nor reach
# the parameters. A recording whose backward ran with grad mode on is never replayed, nor is anything under its key
# afterwards (_Entry.twice): such a call runs per op on every step (counted in Replayer.recorded, not in `warming`:
# Note [Forwards that never replay]). Such calls are told apart at call time by a leaf input that requires grad
# (`x.requires_grad_(True)` before the critic), which joins the key: WGAN-GP's D(G(z)) (a non-leaf input) shared its
# key with the penalty's D(x), the two recordings alternated with different backwards and neither ever replayed.
# A penalty on a non-leaf input still shares its key with the plain calls, which then all run per op. Should a
# ready recording's replay still meet a create_graph backward (plain calls recorded first), gpemu warns once, that
# backward's double backward is not charged, and the key is marked as above. Not checked (grad mode is read only off
# that path, to keep a replayed step's calls): a plain `backward(create_graph=True)` through a replay whose
# parameters are detached (Note [Detached parameters]), which torch itself warns against for parameters.
def _warn_twice(replayer: Any) -> None:
    _warn_once(replayer, "warned_twice", "gpemu: the backward of a replayed module call was differentiated again "
               "(create_graph=True); its gradients carry no graph, so the double backward through it was not "
               "charged, and later calls under its key run per op (Note [Double backward] in replay.py)")


class _Held:
    """Owner of replayed activation memory: freed after backward, or when the autograd graph dies."""

    __slots__ = ("__weakref__", "release")

    def __init__(self, allocator: Any, handles: list[int]) -> None:
        self.release = weakref.finalize(self, allocator.free_many, handles)


# Note [Saved activations as allocated]: a replayed forward holds what the recorded forward left allocated besides
# its outputs (the activations autograd saved, autocast's weight copies) until its backward. It was one block of
# their total, where the per-op path holds one allocation per tensor. The caching allocator serves many tensors from
# the blocks earlier steps cached, but one block of the total needs a segment that large: litgpt's pretrain of
# TinyLlama-1.1B (micro-batch 4 x 2048, bf16-mixed) on an emulated A100 40GB trained its per-op steps and then died
# on the first replay, asking for 23.48 GiB with 21.0 GiB cached free in smaller segments; on a GPU the same tensors
# fit. A 6-layer MLP with 6 MiB activations reserved 112 MiB replayed against 82 MiB per op. The recording now
# notes the size of each allocation the forward left live (allocator handles newer than the forward's start, less
# the outputs' storages) and the replay allocates the same sizes in the same order (one malloc_many: a few
# microseconds per tensor; the small-pool ones, batch norm's statistics and the like, as a few blocks of their
# summed bytes). When the sizes do not add up to the recorded level (the forward freed something older,
# or an output has no allocation of its own), the replay keeps the single block.


# Note [Outputs sharing a storage]: a forward may return views of one tensor it made: transformers 4.x GPT-2 (and
# other models with the legacy tuple cache) returns each layer's key and value as `past_key_values` in training,
# views at offsets into that layer's fused c_attn output (`split`, then `view` + `permute`). A recording whose
# outputs did not each own a fresh storage was never replayed, so every such training step ran per op (transformers'
# run_clm_no_trainer.py with transformers 4.46, a 4-layer GPT-2 at 8 x 128: 5.5 ms of emulator host per step, 16.2 ms
# wall for 6.9 ms of GPU work; replayed, 0.07 ms and 8.1 ms). The recording now notes each output's
# storage (its bytes and dtype) and offset, counts each storage once in the output bytes (the rest of what the forward
# left allocated is the saved activations), and the replay allocates each storage once and makes the outputs as views
# into it at the recorded offsets: the memory held while the outputs live is the per-op path's. Outputs that view an
# input or a parameter (an identity forward, a returned weight) are still never replayed, nor are outputs of different
# dtypes over one storage.
def _laid_out(rec: Recording) -> tuple[EmuTensor, ...]:
    """Return a replay's output tensors as views into one new storage per recorded output storage."""
    assert rec.out_layout is not None
    storages, places = rec.out_layout
    bases = [torch.empty((nbytes // dtype.itemsize,), dtype=dtype, device=META) for nbytes, dtype in storages]
    return tuple(emu_tensor.wrap(bases[group].as_strided(shape, stride, offset), rec.index, tag="replay: output")
                 for (shape, stride, _dtype, _rg), (group, offset) in zip(rec.out_meta, places, strict=True))


class _ReplayFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rec: Recording, direct: tuple[Any, ...] | None, *tensors: torch.Tensor) -> tuple[  # type: ignore[override]
        torch.Tensor, ...
    ]:
        emu = state.require()
        ctx.direct = direct
        # See Note [Detached parameters]: the parameters are not arguments then, the token is the first tensor
        ctx.params = direct.params if isinstance(direct, _Detached) else tensors[len(tensors) - rec.n_params:]
        device = emu.devices[rec.index]
        alloc = device.allocator
        stream_id = emu.current_stream(rec.index).pool_id  # the allocator pool (Note [CUDA graphs])
        for chunks, event in rec.fwd_segments:  # See Note [Replay with host reads], Note [Copies in forward]
            _charge_chunks(emu, rec.index, chunks)
            if event is None:
                continue
            if event[0] == "read":
                emu_ops.charge_read(rec.index, event[1], event[2], {"replay": True})
            else:
                emu_ops.charge_h2d(rec.index, event[1], event[2], event[3], {"replay": True})
        ctx.rec = rec
        if rec.saved_sizes is not None:  # See Note [Saved activations as allocated]
            ctx.held = _Held(alloc, alloc.malloc_many(list(rec.saved_sizes), stream_id, "replay: saved activations")) if (
                rec.saved_sizes) else None
        else:
            ctx.held = _Held(alloc, [alloc.malloc(rec.saved_bytes, stream_id, "replay: saved activations")]) if (
                rec.saved_bytes > 0) else None
        if rec.out_layout is None:
            outs = tuple(fresh(shape, stride, dtype, rec.index, "replay: output") for shape, stride, dtype, _rg in rec.out_meta)
        else:
            outs = _laid_out(rec)
        # the forward's peak above its end level, while the outputs are held (Note [Saved activations as allocated])
        alloc.transient(rec.fwd_transient_bytes, stream_id, "replay: forward temporaries")
        nondiff = [o for o, m in zip(outs, rec.out_meta, strict=True) if not m[3]]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return outs

    # Note [Adds of a replayed backward]: the replayed backward sets each parameter's gradient itself (Note [Direct
    # gradients]), adding into an existing `.grad` under gradient accumulation, so those adds run inside the replay's
    # own autograd node, whose sequence number lies in the compiled forward's range (Note [Compiled regions] in
    # fusion.py): a compiled model's adds were priced as part of its fused backward groups. On a GPU they are
    # AccumulateGrad's eager kernels, as the per-op path prices them: litgpt's pretrain of pythia-14m (4 x 512 tokens,
    # compiled, 4 micro-steps per optimizer step) read 5.61 ms per replayed micro-step against 6.25 ms per op, its
    # 78 adds charged 77 us instead of 702 us. They are priced one by one now, leaving the open group open.
    # Note [Backward peak]: a per-op backward frees saved activations as it goes and allocates gradients as it goes,
    # so its peak (recorded as bytes above the level at its start) can be far below saved + gradients: BERT's
    # backward peaks 31 MiB above its start while it creates 201 MiB of gradients. The replayed backward briefly
    # allocates the recorded peak's bytes above the level at its start while the saved activations are still held,
    # then releases them and creates the gradients: max_memory_allocated() is the per-op path's (allocating the
    # gradients while still holding the activations overstated a 4-layer BERT's backward peak by 170 MiB, 1526 vs
    # 1350 MiB). Session 5 released the activations first and topped up to the peak afterwards, one block of the
    # activations' bytes plus the temporaries: litgpt's TinyLlama-1.1B on an A100 40GB asked for one 23.97 GiB block
    # with 23.85 GiB cached free in smaller segments and died where the per-op steps had fit (Note [Saved
    # activations as allocated]).
    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:  # type: ignore[override]
        rec: Recording = ctx.rec
        emu = state.require()
        index = rec.index
        alloc = emu.devices[index].allocator
        stream_id = emu.current_stream(index).pool_id  # the allocator pool (Note [CUDA graphs])
        replayer = emu.replay
        if replayer is not None and replayer._close_bwd is not None:
            replayer._close_bwd()  # another top module's backward begins: See Note [Top modules in sequence]
        if rec.fwd_only:  # See Note [Forwards without backward]
            _warn_fwd_only(emu.replay)
            rec.stale = True
        _charge_chunks(emu, index, rec.bwd_chunks)
        det = ctx.direct if isinstance(ctx.direct, _Detached) else None
        capture: dict[int, torch.Tensor] | None = None
        twice = False  # create_graph: its gradients cannot be differentiated (Note [Double backward])
        if det is not None:  # See Note [Detached parameters]
            needs = (*ctx.needs_input_grad[3:], *det.requires_grad)
            direct: tuple[torch.nn.Parameter, ...] | None = det.params
            requested, capture = _rescue.requested, _rescue.capture
            if requested is not None:  # backward(inputs=...) or autograd.grad() naming some of these parameters
                twice = torch.is_grad_enabled()
                mine: tuple[bool, ...] | None = tuple([r and id(p) in requested
                                                       for p, r in zip(det.params, det.requires_grad, strict=True)])
            elif _will_execute(ctx.next_functions[0][0]):  # the token's accumulator runs: a plain backward()
                mine = det.requires_grad
            else:  # backward(inputs=...) or autograd.grad() of other tensors only
                twice = torch.is_grad_enabled()
                mine = (False,) * len(det.params)
        else:
            needs = ctx.needs_input_grad[2:]
            direct = ctx.direct
            mine = None  # per parameter: its gradient is set as .grad here
            twice = torch.is_grad_enabled()
            if direct is not None and not twice:
                # See Note [Direct gradients]
                edges = ctx.next_functions  # (node, input nr) per tensor argument of forward
                first = len(needs) - len(direct)
                try:  # backward(inputs=...) leaves out the parameters whose AccumulateGrad will not run
                    mine = tuple([needs[i] and _will_execute(edges[i][0]) for i in range(first, len(needs))])
                except RuntimeError:  # torch.autograd.grad(): no AccumulateGrad runs; the engine takes the gradients
                    mine = None
                if mine is not None and mine == needs[first:]:  # every parameter's gradient set here: a plain one
                    rec.plain_backwards += 1
        if twice:  # See Note [Double backward]
            _warn_twice(replayer)
            rec.stale = rec.twice = True
        # See Note [Gradient accumulation]: the peak of this kind of backward; existing gradients are added into
        have = _grads_exist(ctx.params)
        adding = have and mine is not None and capture is None
        plan = rec.grad_plans.get((needs, mine, adding))
        if plan is None:
            plan = rec.grad_plans[(needs, mine, adding)] = _GradPlan(rec, needs, mine, adding)
        peaks = rec.bwd_peaks
        # See Note [Backward peak]
        peak_at = alloc.memory_allocated() + (peaks.get(have, max(peaks.values())) if peaks else rec.bwd_peak_bytes)
        malloc = alloc.malloc
        # the peak's temporaries, while the saved activations are still held (Note [Backward peak])
        alloc.transient(peak_at - alloc.memory_allocated(), stream_id, "replay: backward temporaries")
        if ctx.held is not None:
            ctx.held.release()
        block: list[EmuTensor] | tuple[()]
        if capture is not None:  # autograd.grad() of detached parameters: returned by the rescue, not set
            assert direct is not None
            for j, m in zip(plan.block_params, plan.block_metas, strict=True):
                capture[id(direct[j])] = fresh_on(m[0], m[1], m[2], index, "replay: grad", malloc, stream_id)
            block = ()
        elif plan.block_metas:
            assert direct is not None
            block = _grad_block(plan, direct, alloc, stream_id, emu.replay)
        else:
            block = ()
        out: list[Any] = [None] * len(needs)
        for i, m in plan.engine:
            out[i] = fresh_on(m[0], m[1], m[2], index, "replay: grad", malloc, stream_id)
        fusion = emu.phases.fusion
        fusion.accumulating = True  # See Note [Adds of a replayed backward]
        try:
            if block:
                assert direct is not None
                with _plain_attrs():  # See Note [Tensor attributes from Python]
                    for j, g in zip(plan.block_params, block, strict=True):
                        p = direct[j]
                        grad = p.grad
                        if grad is None:
                            p.grad = g
                        else:
                            grad.add_(g)
                if plan.pool is not None and emu.replay is not None:  # only now: its gradients are held as `.grad`
                    emu.replay.armed.append(plan.pool)
            if plan.added:  # one at a time, each freed after its add, as AccumulateGrad does
                assert direct is not None
                with _plain_attrs():
                    for j, m in plan.added:
                        p = direct[j]
                        g = fresh_on(m[0], m[1], m[2], index, "replay: grad", malloc, stream_id)
                        grad = p.grad
                        if grad is None:
                            p.grad = g
                        else:
                            grad.add_(g)
                        del g
        finally:
            fusion.accumulating = False
        if det is not None:
            return (None, None, None, *out[:len(needs) - len(det.params)])
        return (None, None, *out)


# Note [Recycled gradients]: a replayed training step gives every parameter a new gradient (resnet50: 161 block
# wrappers, Note [Block wrappers] in tensor.py), and zero_grad() drops them all: building the wrappers and
# deallocating them was ~0.3 ms of a ~2.3 ms replayed resnet50 step. So a plan keeps the wrappers of its last
# block (_GradPool) and, once every one of them has been dropped, frees their allocations and hands the same
# wrappers out again as the next backward's gradients (new allocations, so memory_allocated, its peak and the
# allocation counts are what new gradients give). "Dropped" means: no parameter holds it as `.grad` and no Python
# reference other than the pool's exists (sys.getrefcount), and its meta tensor was never built (an op that
# unwrapped it may have made views or registered its storage). The check runs after Optimizer.zero_grad() and
# Module.zero_grad(), and at the start of every top-module call (for `p.grad = None` loops of the script's own), so
# the allocations are freed by the next forward at the latest: a script that drops gradients by hand and reads
# memory_allocated() before its next forward sees them still allocated. A gradient still held when the next
# backward needs the plan's block makes the plan let go of the old block (its wrappers then die with their last
# holder, as before) and build a new one. A recycled gradient is the same Python object as the one the previous
# step dropped; nothing that dropped it can tell.
_POOL_REFS = 3  # sys.getrefcount of a dropped gradient in release()'s loop: the pool's list, the loop name, the call


class _GradPool:
    """The gradients a plan's last replayed backward set as `.grad`, for reuse (Note [Recycled gradients])."""

    __slots__ = ("grads", "owner", "params", "released")

    def __init__(self, params: list[torch.Tensor], grads: list[EmuTensor]) -> None:
        self.params = params
        self.grads = grads
        self.owner = grads[0]._own
        self.released = False

    def release(self) -> bool:
        """Free the gradients' allocations when every one of them has been dropped; return True if they were."""
        if self.released:
            return True
        getrefcount = sys.getrefcount
        with _plain_attrs():
            for p, g in zip(self.params, self.grads, strict=True):
                if p.grad is g:
                    return False
        for g in self.grads:
            if getrefcount(g) > _POOL_REFS or "_elem" in g.__dict__:
                return False
        owner = self.owner
        owner.free_many(owner.handles)
        owner.handles = []
        self.released = True
        return True


def _grad_block(plan: _GradPlan, direct: tuple[torch.nn.Parameter, ...], alloc: Any, stream_id: int,
                replayer: Any) -> list[EmuTensor]:
    """Return the block of gradients the replayed backward sets as `.grad`: the plan's recycled wrappers when all
    were dropped, else new ones (Note [Recycled gradients])."""
    pool = plan.pool
    if pool is not None:
        if replayer is not None and pool in replayer.armed:  # the caller arms it again once the grads are set
            replayer.armed.remove(pool)
        if pool.release():
            pool.owner.handles = alloc.malloc_many(plan.block_sizes, stream_id, "replay: grad")
            pool.released = False
            return pool.grads
        plan.pool = None  # still held somewhere: its wrappers keep the lifetime of their holders
    block = fresh_block(plan.block_metas, plan.block_sizes, "replay: grad", alloc, stream_id)
    if replayer is not None:
        plan.pool = _GradPool([direct[j] for j in plan.block_params], block)
    return block


class _GradPlan:
    """Which gradients one replayed backward builds, and how (per needs_input_grad and direct-gradient pattern)."""

    def __init__(self, rec: Recording, needs: tuple[bool, ...], mine: tuple[bool, ...] | None,
                 adding: bool = False) -> None:
        first = len(needs) - (len(mine) if mine is not None else 0)
        self.engine: list[tuple[int, tuple[Any, ...]]] = [  # gradients returned to the autograd engine
            (i, m) for i, (m, n) in enumerate(zip(rec.in_meta[:first], needs[:first], strict=True)) if n
        ]
        # gradients set as `.grad` here, built as one block (Note [Block wrappers]); a parameter that needs a
        # gradient but whose AccumulateGrad will not run (backward(inputs=...)) gets none
        self.block_params: list[int] = [j for j, ok in enumerate(mine or ()) if ok]
        # adding into existing .grad (Note [Gradient accumulation]): made one at a time, not in the block
        self.added: list[tuple[int, tuple[Any, ...]]] = []
        if adding:
            self.added = [(j, rec.in_meta[first + j]) for j in self.block_params]
            self.block_params = []
        self.block_metas: list[tuple[Any, ...]] = [(*rec.in_meta[first + j], rec.index) for j in self.block_params]
        self.block_sizes = block_sizes([meta_nbytes(mk[:3]) for mk in self.block_metas])
        self.pool: _GradPool | None = None  # See Note [Recycled gradients]


# Note [Host tensor arguments]: a top module may be called with a host tensor beside its device inputs, which its
# forward copies to the device: diffusers' DDPMPipeline / DDIMPipeline call `unet(image, t)` with each 0-d CPU
# tensor of `scheduler.timesteps`, and UNet2DModel runs `timesteps[None].to(sample.device)`. Such a call had no
# replay key, so every denoising step ran per op (train_unconditional.py's end-of-epoch sampling of 16 images at
# 32 px on an emulated A100: ~20 ms of emulator host per step for 6.8 ms of GPU work). A host tensor argument now
# joins the key by its metadata (shape, strides, dtype), not its value, and a recording is replayable only when the
# forward copied every host tensor argument to the device (a copy whose source shares the argument's storage:
# `t[None].to(device)` reads t's): the replay queues that copy (Note [Copies in forward]), and a read of the copied
# value on the device already makes the recording unreplayable. So a timestep loop replays from its third step
# whatever the timestep. A host argument the forward never copies (pack_padded_sequence's CPU lengths, whose values
# decide shapes) keeps every call per op, as before. What gpemu cannot see is what the forward does with the host
# argument besides copying it (`if t > 500:` on the CPU tensor, or lengths both copied for a mask and packed): such
# a forward would replay the path its recordings took; two recordings must still match op for op (same kernels at
# the same costs) before the first replay, which a value that changes shapes or the path usually prevents.
def _host_argument(t: torch.Tensor) -> bool:
    """Return True for a plain strided CPU tensor that does not require grad (Note [Host tensor arguments])."""
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad
            and not t.is_nested)


def _tensor_key(t: EmuTensor) -> tuple[Any, ...]:
    # the device index too: an input on another GPU than the recording's must not replay it (Note [Tensors on two
    # devices] in tensor.py: the per-op path raises as torch does); a leaf that requires grad apart from the rest
    # (Note [Double backward])
    rg = t.requires_grad
    return (type(t), tuple(t.shape), t.stride(), t.dtype, rg, rg and t.grad_fn is None, t._index)


class Replayer:
    """Decides per top-module call between recording (per-op path) and replaying a recording."""

    def __init__(self, emu: Any) -> None:
        self.emu = emu
        # per top module (dropped with it): key -> recordings
        self.entries: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[Any, ...], _Entry]] = (
            weakref.WeakKeyDictionary()
        )
        # per top module: key -> the reads of its forward that depend on input values (what they read joins the
        # key). See Note [Replay with host reads]
        self.programs: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[Any, ...], _ReadProgram]] = (
            weakref.WeakKeyDictionary()
        )
        # top modules whose forward read a value range or returned tensors with one: their inputs' ranges join the
        # key (Note [Ranges through replay])
        self.range_keyed: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.replayed = 0  # calls replayed (for tests and reports)
        self.warned_fwd_only = False  # Note [Forwards without backward]
        self.warned_twice = False  # Note [Double backward]
        self.recorded = 0  # calls recorded on the per-op path
        self.warming = 0  # those of them that may still replay, for the run report: Note [Forwards that never replay]
        self._sink: list[tuple[str, float, str]] | None = None
        self._sink_rec: Recording | None = None
        self._sink_bwd = False
        self._skipped = 0
        self.armed: list[_GradPool] = []  # gradient pools in use: Note [Recycled gradients]
        self._close_bwd: Any = None  # ends the backward recording now open (Note [Top modules in sequence])
        self._bwd_mark = 0  # the allocator's handle mark when that recording began (Note [Gradient sums across calls])

    def release_grads(self) -> None:
        """Free the allocations of recycled gradients that were dropped (Note [Recycled gradients])."""
        armed = self.armed
        if armed:
            self.armed = [pool for pool in armed if not pool.release()]

    # -- the Module.__call__ patch

    def call(self, orig: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Return module(*args, **kwargs): replayed when a matching recording is ready, else per op (recorded)."""
        first = next((a for a in args if isinstance(a, EmuTensor)), None)
        if first is None:  # `model(**batch)`: Hugging Face style, every tensor a keyword argument
            first = next((v for v in kwargs.values() if isinstance(v, EmuTensor)), None)
        if first is None or self._sink is not None:
            return orig(module, *args, **kwargs)
        if self.armed:  # gradients dropped by the script's own loop: Note [Recycled gradients]
            self.release_grads()
        if type(module).__name__ in _NEVER_REPLAY:
            return orig(module, *args, **kwargs)
        with _plain_attrs():  # See Note [Tensor attributes from Python]
            walk = _walk(module)
            key = self._key(module, args, kwargs, walk[1]) if walk is not None else None
        if walk is None or key is None:
            return orig(module, *args, **kwargs)
        base = key
        sub: tuple[Any, ...] | None = None
        by_key = self.programs.get(module)
        if by_key:
            program = by_key.get(key)
            if program is not None:
                sub = program.key([v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)])
                key = (key, sub)
        per_module = self.entries.get(module)
        if per_module is None:
            per_module = self.entries[module] = {}
        entry = per_module.get(key)
        if entry is None:
            entry = per_module[key] = _Entry(siblings=per_module)
        params, params_key, direct_ok = walk
        if entry.ready is not None and entry.ready.stale:
            entry.twice = entry.ready.twice  # See Note [Double backward]
            entry.ready = entry.last = None
        if entry.ready is not None:
            direct = tuple(params) if direct_ok and not _distributed() else None
            with _plain_attrs():
                return self._replay(module, entry.ready, args, kwargs, params, direct, params_key[1])
        return self._record(orig, module, entry, first._index, args, kwargs, params, base, sub)

    def _key(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
             params_key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        parts: list[Any] = [module.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                            self.emu.autocast_dtype(), self.emu.current_stream(self.emu.current_device()).stream_id,
                            _fp32_math_modes(),  # TF32 flags set between calls change the recorded costs
                            # and the SDPA backends allowed (`sdpa_kernel`) its kernels: Note [SDPA backend choice] in sdpa.py
                            (_cuda_backends.flash_sdp_enabled(), _cuda_backends.mem_efficient_sdp_enabled(),
                             _cuda_backends.math_sdp_enabled())]
        for v in (*args, *kwargs.keys(), *kwargs.values()):
            if isinstance(v, torch.Tensor):
                if isinstance(v, EmuTensor) and v.layout is not torch.strided:
                    return None  # a sparse argument: per op (Note [Sparse matrices on the device] in sparse.py)
                if isinstance(v, EmuTensor):
                    parts.append(_tensor_key(v))
                elif _host_argument(v):  # See Note [Host tensor arguments]
                    parts.append(("host", tuple(v.shape), v.stride(), v.dtype))
                else:
                    return None
            else:
                try:
                    hash(v)
                except TypeError:
                    return None
                parts.append(v)
        parts.append(params_key)
        if module in self.range_keyed:  # Note [Ranges through replay]
            parts.append(tuple(emu_ops.value_range(v) for v in (*args, *kwargs.values())
                               if isinstance(v, EmuTensor)))
        return tuple(parts)

    # -- recording

    def sink(self, index: int, name: str, predicted_s: float, category: str, stream_id: int) -> None:
        """Collect one charged op into the recording being made (set as tensor.record_sink)."""
        rec = self._sink_rec
        if rec is None or self._sink is None:
            return
        if self._sink_bwd:
            node = torch._C._current_autograd_node()
            # AccumulateGrad runs per op on replay too; so does the backward of a node made before this module's
            # forward (an op between two top modules: Note [Top modules in sequence]), and the sum of this call's
            # gradient with another call's (Note [Gradient sums across calls])
            if node is not None and (node.name() == _ACCUMULATE_GRAD or node._sequence_nr() < rec.seq_lo
                                     or (name in _ADDS and self._across(emu_tensor.sink_args[0]))):
                self._skipped += 1
                return
        if index != rec.index or stream_id != rec.stream_id:
            rec.ok = False
        self._sink.append((name, predicted_s, category))

    # Note [Gradient sums across calls]: a parameter used by several calls in one backward pass (WGAN-GP's critic on
    # real and on generated images and through the penalty's double backward; CycleGAN's generators) gets one
    # gradient contribution per call, and the engine sums them in the parameter's input buffer: an add per parameter
    # inside whichever call's backward recording is open when the next contribution arrives. A replay of that call
    # adds its gradient into `.grad` itself (Note [Direct gradients]) or returns it to the engine, which sums it per
    # op, so the recorded add was charged twice: WGAN-GP's replayed critic steps read 8.9 % more GPU time than per op,
    # the CycleGAN test's 6.4 % (Note [Alternating backwards]). An add in a backward recording whose two arguments
    # are one gradient made before that backward began (another call's) and one made since (this call's) is now left
    # out of the recording, as AccumulateGrad's ops are: it runs per op, or as the replay's own add. tensor.py hands
    # the op's arguments over in `sink_args` while it charges an op under a recording. An add of a gradient and a
    # forward activation of the same shape inside one backward formula would be left out too (none is known: such
    # formulas have their own backward kernels).
    def _across(self, args: Any) -> bool:
        """Return True when an add's arguments are a gradient made before the backward being recorded began and one
        made since, of one shape (Note [Gradient sums across calls])."""
        if not args or len(args) < 2 or type(args[0]) is not EmuTensor or type(args[1]) is not EmuTensor:
            return False
        a, b = args[0], args[1]
        if a.shape != b.shape:
            return False
        ha, hb, mark = emu_tensor.storage_handle(a), emu_tensor.storage_handle(b), self._bwd_mark
        return bool(ha and hb) and (ha < mark) != (hb < mark)

    def _read(self, nbytes: int, reason: str, sources: frozenset[int], expr: emu_ops.HostExpr | None,
              value: torch.Tensor | None) -> None:
        """Note one host read in the forward being recorded (set as ops.read_sink)."""
        rec = self._sink_rec
        if rec is None or self._sink is None:
            return
        if rec.copies and rec.copies[-1][0] == len(self._sink):  # a copy and a read between the same two ops
            rec.ok = False
        rec.reads.append((len(self._sink), nbytes, reason))
        if sources & rec.copy_sources:  # a value the forward copied from the host: it may change every call
            rec.ok = False
        if sources and value is not None:
            rec.read_sources.update(sources)
            rec.value_reads.append((expr, value, sources))

    def _file_reads(self, module: torch.nn.Module, entry: _Entry, rec: Recording, inputs: list[torch.Tensor],
                    base: tuple[Any, ...], sub: tuple[Any, ...] | None) -> None:
        """After recording a forward with reads of input-derived values: on the first such call, make its read
        program and file the recording under the full key; later, check what it read is what its key promised."""
        positions = tuple(i for i, t in enumerate(inputs) if emu_ops.known_sources(t) & rec.read_sources)
        if not positions:
            return
        from_inputs = frozenset().union(*(emu_ops.known_sources(inputs[i]) for i in positions))
        dep = [(e, v) for e, v, s in rec.value_reads if s & from_inputs]
        read_key = ("reads", tuple(_digest(v) for _e, v in dep))
        by_key = self.programs.get(module)
        if by_key is None:
            by_key = self.programs[module] = {}
        program = by_key.get(base)
        if program is None:  # this call ran under the plain key: file its recording under the full one
            bound = tuple(emu_ops.known_expr(inputs[i]) for i in positions)
            reads = tuple(e for e, _v in dep)
            program = _ReadProgram(positions, None, None)
            if all(e is not None for e in (*bound, *reads)):
                program = _ReadProgram(positions, bound, reads)  # type: ignore[arg-type]
                if program.key(inputs) != read_key:  # recomputing does not give what was read: key by the inputs
                    program = _ReadProgram(positions, None, None)
            by_key[base] = program
            self.entries[module].setdefault((base, program.key(inputs)), entry)
        elif sub is not None and sub[0] == "reads" and sub != read_key:
            rec.ok = False  # the path read more (or other) values than its key: never replay it

    def _copy(self, nbytes: int, pinned: bool, non_blocking: bool, out: torch.Tensor,
              src: torch.Tensor | None = None) -> None:
        """Note one host-to-device copy in the forward being recorded (set as ops.copy_sink)."""
        rec = self._sink_rec
        if rec is None or self._sink is None:
            return
        pos = len(self._sink)
        if rec.reads and rec.reads[-1][0] == pos:  # a read and a copy between the same two ops: keep their order
            rec.ok = False
        rec.copies.append((pos, nbytes, pinned, non_blocking))
        rec.copy_sources.add(id(out))
        if src is not None and src.device.type == "cpu":
            rec.copied_hosts.add(src.untyped_storage().data_ptr())

    def _open(self, rec: Recording, ops: list[tuple[str, float, str]], bwd: bool) -> None:
        self._sink, self._sink_rec, self._sink_bwd, self._skipped = ops, rec, bwd, 0
        emu_tensor.record_sink = self.sink
        if not bwd:
            emu_ops.read_sink = self._read
            emu_ops.copy_sink = self._copy

    def _close(self) -> int:
        emu_tensor.record_sink = None
        emu_ops.read_sink = None
        emu_ops.copy_sink = None
        self._sink, self._sink_rec, self._sink_bwd = None, None, False
        return self._skipped

    def _record(self, orig: Any, module: torch.nn.Module, entry: _Entry, index: int, args: tuple[Any, ...],
                kwargs: dict[str, Any], params: list[torch.nn.Parameter], base: tuple[Any, ...],
                sub: tuple[Any, ...] | None) -> Any:
        emu = self.emu
        device = emu.devices[index]
        rec = Recording(index, emu.current_stream(index).stream_id)
        inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        rec.in_meta = [(tuple(t.shape), t.stride(), t.dtype) for t in (*inputs, *params)]
        rec.n_params = len(params)
        win = _Window(device)
        rng_before = _host_rng_state()
        buffers_before = _buffer_versions(module) if module.training else ()  # Note [Forwards without backward]
        rec.seq_lo = _next_sequence_nr()
        range_reads = emu_ops.range_answers[0]
        draws = emu_ops.known_draws[0]  # Note [Known draws in forward]
        self._open(rec, rec.fwd, bwd=False)
        try:
            out = orig(module, *args, **kwargs)
        finally:
            self._close()
            end, peak = win.close()
        ranged = emu_ops.range_answers[0] != range_reads  # Note [Ranges through replay]
        self.recorded += 1
        # recording before replay, unless this key's previous recording could not be replayed
        self.warming += entry.tried is None or entry.tried.ok  # See Note [Forwards that never replay]
        entry.tried = rec
        drawn = _host_rng_state() != rng_before or emu_ops.known_draws[0] != draws  # Note [Known draws in forward]
        rec.ok = rec.ok and win.clean(len(rec.fwd), rec.reads, rec.copies) and not drawn
        if rec.ok and any(not isinstance(t, EmuTensor) and t.untyped_storage().data_ptr() not in rec.copied_hosts
                          for t in inputs):  # See Note [Host tensor arguments]
            rec.ok = False
        if rec.read_sources:  # reads that depended on host values: which inputs? See Note [Replay with host reads]
            self._file_reads(module, entry, rec, inputs, base, sub)
        leaves, rec.out_spec = _flatten_output(out)
        for i, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                other = _other_leaf(t)
                if other is None:
                    rec.ok = False
                    return out
                rec.out_other[i] = other
            else:
                j = next((j for j, x in enumerate(inputs) if x is t), -1)
                if j >= 0:  # See Note [Inputs returned]
                    rec.out_inputs[i] = j
        leaves = [t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and i not in rec.out_inputs]
        if not leaves or not all(isinstance(t, EmuTensor) and t._index == index for t in leaves):
            rec.ok = False
            return out
        if emu_ops._ranges or emu_ops._known:  # Note [Ranges through replay]
            ranges = tuple(emu_ops.value_range(t) for t in leaves)
            rec.out_ranges = ranges if any(r is not None for r in ranges) else ()
            ranged = ranged or bool(rec.out_ranges)
        if ranged and module not in self.range_keyed:  # keyed without the inputs' ranges: record again with them
            self.range_keyed.add(module)
            rec.ok = False
        # by the inner meta storage, which views share (Note [Memory by storage] in tensor.py): an output that is a
        # view of an input or a parameter is never replayed; outputs viewing one storage made in this forward are laid
        # out again on replay (Note [Outputs sharing a storage])
        known = {t._elem.untyped_storage()._cdata for t in (*inputs, *params) if isinstance(t, EmuTensor)}
        groups: dict[int, int] = {}
        storages: list[tuple[int, torch.dtype]] = []
        places: list[tuple[int, int]] = []
        plain = True
        out_bytes = 0
        for t in leaves:
            st = t._elem.untyped_storage()
            group = groups.get(st._cdata)
            if st._cdata in known:
                rec.ok = False
            if group is None:
                group = groups[st._cdata] = len(storages)
                storages.append((st.nbytes(), t.dtype))
                out_bytes += round_size(st.nbytes())
                fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META).untyped_storage()
                plain = plain and not t.storage_offset() and st.nbytes() == fresh.nbytes()
            else:
                plain = False
                rec.ok = rec.ok and storages[group][1] == t.dtype
            places.append((group, t.storage_offset()))
            rec.out_meta.append((tuple(t.shape), t.stride(), t.dtype, t.requires_grad))
        rec.out_layout = None if plain else (tuple(storages), tuple(places))
        rec.saved_bytes = end - win.start - out_bytes
        rec.fwd_transient_bytes = peak - end
        rec.saved_sizes = _saved_sizes(device.allocator, win.mark, leaves, end - win.start)
        if rec.saved_bytes < 0:
            rec.ok = False
        grad_out = next((t for t in leaves if t.requires_grad), None)
        if grad_out is None or not torch.is_grad_enabled():
            self._finish(entry, rec)
        elif rec.ok:
            hook = self._bwd_hook(entry, rec, device, params)
            if not module.training or _buffer_versions(module) == buffers_before:  # Note [Forwards without backward]
                weakref.finalize(hook.sentinel, self._graph_dropped, entry, rec)  # type: ignore[attr-defined]
            for t in leaves:  # every output: the first gradient to arrive opens the backward (Note [First gradient])
                if t.requires_grad:
                    t.register_hook(hook)
        return out

    def _graph_dropped(self, entry: _Entry, rec: Recording) -> None:
        """The graph of a recorded forward died: without a backward, finish it as a forward-only recording."""
        if rec.bwd_started or rec.done or not rec.ok:
            return
        rec.fwd_only = True
        self._finish(entry, rec)

    # Note [First gradient]: the backward recording opened when the gradient of the first output requiring grad (in
    # output order) arrived. Autograd runs nodes newest first, so when a later output's path is the last one the
    # forward built (an actor-critic returning (log_prob, entropy, value), the critic computed last), its backward ran
    # before that first output's gradient arrived: outside the recording, and gone on replay, where the whole forward
    # is one node. A step of such a module read less GPU time replayed than per op (a 4-to-2 actor with a Categorical
    # and a 4-to-1 critic, batch 64, Adam: 0.40 vs 0.45 ms). Every output requiring grad now gets the hook, and the
    # first gradient to arrive opens the backward; the others find it open.
    # Note [Top modules in sequence]: a module's backward is recorded from the moment its output's gradient arrives
    # until the backward pass ends. That is the module's own backward when it is the whole model, but not when a step
    # calls several top modules in sequence: `model.forward(x)` called directly (pytorch/tutorials
    # optimizer_step_in_backward calls a ViT's forward so, which makes its children the top modules), a GAN's
    # D(G(z)). The last one's recording then held the backward of every module before it; replayed, it charged
    # those again beside their own (per-op or replayed) backward: the ViT-L tutorial step read 79.9 ms of GPU time
    # replayed vs 60.5 per op, pytorch/examples dcgan (G's backward inside D's recording) 18.31 vs 15.78 ms. When the output gradient of another top module arrives while a backward recording
    # is open, the open module's backward has produced the gradient of its input, so its recording ends there and
    # the other module's begins. Ops between two top modules (a ResNet's avgpool and flatten between layer4 and fc,
    # called from the model's own forward) belong to neither: a recording leaves out the backward of autograd nodes
    # made before its forward began (lower sequence numbers; those made later, by a reentrant checkpoint's
    # recomputation, stay in), and they run per op on replay as they did while recording. Each recording then holds
    # its own part and a step charges what the per-op path does. A replayed call's backward ends the open recording
    # too (it is another top module's output gradient arriving): WGAN-GP's D(G(z)) recorded per op at every step once
    # D(real) replayed, whose replayed backward then ran inside D(G(z))'s recording window.
    def _bwd_hook(self, entry: _Entry, rec: Recording, device: Any, params: list[torch.nn.Parameter]) -> Any:
        sentinel = _Sentinel()  # lives as long as the hook, i.e. the graph (Note [Forwards without backward])

        def hook(grad: torch.Tensor) -> None:
            if rec.bwd_started and self._sink_rec is rec and self._sink_bwd:
                return  # another output's gradient: this call's backward is already being recorded
            if self._sink is not None and self._sink_bwd and self._close_bwd is not None and not rec.bwd_started:
                self._close_bwd()  # See Note [Top modules in sequence]
            if rec.bwd_started or self._sink is not None:
                rec.ok = False
                return
            rec.bwd_started = True
            rec.bwd_state = _grads_exist(params)
            if torch.is_grad_enabled():  # create_graph: See Note [Double backward]
                rec.ok = False
                rec.twice = True
            win = _Window(device)
            self._bwd_mark = win.mark
            self._open(rec, rec.bwd, bwd=True)
            closed = False

            def close() -> None:
                nonlocal closed
                if closed:
                    return
                closed = True
                self._close_bwd = None
                skipped = self._close()
                _end, peak = win.close()
                rec.ok = rec.ok and win.clean(len(rec.bwd) + skipped) and not _grads_consumed(params)
                rec.bwd_peak_bytes = peak - win.start
                self._finish(entry, rec)

            self._close_bwd = close
            torch.autograd.Variable._execution_engine.queue_callback(close)

        hook.sentinel = sentinel  # type: ignore[attr-defined]
        return hook

    def _finish(self, entry: _Entry, rec: Recording) -> None:
        rec.done = True
        if rec.twice or entry.twice:  # See Note [Double backward]
            entry.twice = True
            return
        last, before = entry.last, entry.before_last
        entry.last, entry.before_last = rec, last
        matched = last is not None and last.ok and last.matches(rec)
        if rec.ok and (matched or _like_a_sibling(entry, rec)):  # See Note [New shapes]
            rec.bwd_peaks = {last.bwd_state: last.bwd_peak_bytes} if matched and last is not None else {}
            rec.bwd_peaks[rec.bwd_state] = rec.bwd_peak_bytes
            _make_ready(entry, rec)
        elif (rec.ok and last is not None and last.ok and before is not None and before.ok and before.matches(rec)
              and _alternates(last, rec)):  # See Note [Alternating backwards]
            plain = rec if len(rec.bwd) <= len(last.bwd) else last
            plain.bwd_peaks = {plain.bwd_state: plain.bwd_peak_bytes}
            _make_ready(entry, plain)

    # -- replay

    def _replay(self, module: torch.nn.Module, rec: Recording, args: tuple[Any, ...], kwargs: dict[str, Any],
                params: list[torch.nn.Parameter], direct: tuple[torch.nn.Parameter, ...] | None,
                rg: tuple[bool, ...]) -> Any:
        phases = self.emu.phases
        inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        phases.pending_kwargs = (module, kwargs) if kwargs else None
        phases._pre(module, args)
        outs: Any = None
        try:
            if direct is not None and rec.plain_backwards and torch.is_grad_enabled():  # Note [Detached parameters]
                token = _TOKEN_BASE.detach().requires_grad_()  # a new leaf (a CPU one, whatever the default device)
                det = _Detached(direct, token, rg)
                _live_detached.add(det)
                outs = _ReplayFn.apply(rec, det, token, *inputs)
            else:
                outs = _ReplayFn.apply(rec, direct, *inputs, *params)
        finally:
            phases._post(module, args, outs)
        self.replayed += 1
        for t, r in zip(outs, rec.out_ranges, strict=False):  # Note [Ranges through replay]
            if r is not None:
                emu_ops.set_value_range(t, *r)
        if not rec.out_other and not rec.out_inputs:
            return _unflatten_output(list(outs), rec.out_spec)
        tensors = iter(outs)
        n = len(outs) + len(rec.out_other) + len(rec.out_inputs)
        leaves = [inputs[rec.out_inputs[i]] if i in rec.out_inputs else tensors.__next__() if i not in rec.out_other
                  else (rec.out_other[i][1] if rec.out_other[i][0] else rec.out_other[i][1]()) for i in range(n)]
        return _unflatten_output(leaves, rec.out_spec)


# Note [Ranges through replay]: a replayed forward runs none of its ops, so its outputs would lose the value ranges
# the per-op path gives them (Note [Value ranges] in ops.py): TopKPooling's pooled batch vector, replayed, read its
# max as 0 again and the next global pooling pooled one graph. A recording keeps its output tensors' ranges and the
# replay gives them back. A range is a function of the inputs' ranges (the ops that keep one only move elements), and
# so is a read of a range's end in forward (`int(batch.max()) + 1`), so a top module whose forward read one or
# returned a ranged tensor is keyed by its inputs' ranges from then on (the recording that revealed it, made under
# the plain key, is never replayed). Modules that do neither (almost all: a model's math has no ranges) keep their key.


# Note [Gradient accumulation]: with gradient accumulation (the HF Trainer's gradient_accumulation_steps, nanoGPT)
# the first backward of a step creates every parameter's .grad, which stays allocated, and the next ones add into
# them (each new gradient is freed at once), so their backward peaks differ. The recordings alternated A, B, A, B and
# no two consecutive ones matched: the model was never replayed. The forward is the same either way, and which kind
# a backward is shows only when it starts (pytorch/examples call zero_grad() between forward and backward), so a
# recording notes the gradients' state at its backward's start (_grads_exist), recordings in different states match on
# everything but the backward peak, and the ready recording keeps the peak of each state it saw; the replayed
# backward takes the peak of the state it finds (the largest one for a state not seen) and, for a parameter whose
# .grad exists, makes its gradient and adds it in one at a time, as AccumulateGrad does.


# Note [Host randomness in forward]: a forward that draws host random numbers to choose its path (transformers'
# LayerDrop: `torch.rand([]) < self.layerdrop` skips a layer; a block skipped on `random.random()`; mixup drawn with
# numpy inside a model wrapper) runs other ops on other calls, and a replay would repeat the recorded path every
# time. A recording whose forward moved torch's CPU generator, Python's `random` or numpy's global generator is
# never replayed. The emulated CUDA generators are separate generators (Note [Emulated CUDA generators] in rng.py):
# dropout and other device-side randomness leave these alone.
def _host_rng_state() -> tuple[Any, ...]:
    """Return the state of the host's global random generators (torch CPU, `random`, numpy when imported)."""
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    return (torch.default_generator.get_state().numpy().tobytes(), random.getstate(),
            None if np_state is None else (np_state[1].tobytes(), np_state[2]))


# Note [Known draws in forward]: a forward that samples on the device and returns the draw (Stable-Baselines3's
# ActorCriticPolicy.forward: `actions = distribution.get_actions()`, a Categorical's multinomial, returned beside the
# values and log-probabilities, read by `actions.cpu().numpy()` for every environment step) gets new draws on every
# call on a GPU. gpemu knows such draws on the host (Note [Sampled categories] in ops.py; randperm's), but a replayed
# forward runs none of its ops, so once the recording was ready its actions came back unknown: zeros. The
# rl-baselines3-zoo PPO CartPole run read every action as 0 after its first few environment steps, and episodes
# lasted ~9.3 steps where an untrained policy's last ~22 (CleanRL calls its agent's method, not the module, and was
# not replayed). A recording whose forward made a draw the host knows is never replayed, as with host randomness
# above: such a forward runs per op on every call (its cost is the same; the emulator's own host time is that of the
# per-op path). Device-side
# randomness whose values are not known (dropout, `randn_like`) does not count.
# Note [Forwards that never replay]: the run report leaves out later iterations in which the replay path recorded a
# call (Note [Recording steps later on] in report/summary.py): recording a new key is the emulator's warm-up, not the
# script's. A forward that can never be replayed (a draw the host knows, host randomness, a forward that frees what
# the previous call left on `self`: SB3's SAC actor keeps its last Normal distribution and Gaussian actions on its
# `action_dist` and frees them in the next forward, so the forward's net allocation reads negative) also runs per op
# on every call, but that is its steady state. Each call was counted as recorded: the zoo's PPO run left its 78
# rollout iterations (32 policy calls each) out of the means, its SAC run 2,899 of 8,700 iterations (the one with each
# environment step's action), both as "recorded per op (a new input shape or mode)". A call now counts as recorded
# unless the previous recording under its key could not be replayed (Replayer.warming, the report's meter;
# Replayer.recorded still counts every call recorded per op).


_SEQ_PROBE = torch.zeros(())


def _next_sequence_nr() -> int:
    """Return the sequence number the next autograd node made on this thread gets (probes with one CPU node)."""
    with torch.enable_grad():
        probe = _SEQ_PROBE.detach().requires_grad_().mul(1)
    node = probe.grad_fn
    return -1 if node is None else int(node._sequence_nr()) + 1  # None under inference_mode: no backward follows


def _grads_exist(params: Any) -> bool:
    """Return True when the first parameter that requires grad has a .grad: the gradients are added into
    (Note [Gradient accumulation]; all parameters of a model are in one state in a training loop)."""
    for p in params:
        if p.requires_grad:
            return p.grad is not None
    return False


# Note [Copies in forward]: a forward may copy host tensors to the device on every call (initial RNN states built as
# `torch.zeros(...).to(device)`, a position or length tensor built with `torch.tensor(..., device=...)`). Such a
# recording was never replayed. Each copy is now recorded in place (bytes, pinned, non_blocking) and the replayed
# forward queues the same copy, and waits for it as the copy did (pageable or blocking). The copied values are not
# kept: a recording whose host reads depend on a value copied inside the forward (it may differ every call) is
# never replayed, and neither is one with a read and a copy between the same two ops (their order is not kept).
# Note [Inputs returned]: a forward may return one of its input tensors itself beside what it computed: the Lightning
# Fabric PPO agent's `get_action_and_value(x, action)` returns the action it was given with its log-prob, entropy and
# value. Such an output's storage is an input's, and a recording with an output over an input's storage was never
# replayed: every PPO minibatch step ran per op (~180 ops, 3.4 ms of emulator host for 1.4 ms of GPU work). An output
# leaf that is an input tensor (the same object) is now noted by position, and the replay returns that call's input
# there, as the module does; the other outputs replay as before. An output that views an input (`x.view(...)`,
# `x[0]`) or is a parameter still makes the call unreplayable.
# Note [Output objects]: a top module may return objects that are not tensors beside its tensors. Constants (None,
# numbers, strings) are returned as recorded. A transformers Cache (GPT-2 and other causal LMs build a DynamicCache
# on every training forward while config.use_cache is on, and return it in the output) is returned as a new empty
# cache of the same class: training code does not read it, and the recorded one would keep the recorded call's keys
# and values alive. An encoder-decoder model's EncoderDecoderCache (T5, BART, Whisper) needs its two caches as
# arguments: it is rebuilt from two new empty ones (before session 5 it made those models unreplayable: a T5
# training step stayed on the per-op path). Any other object makes the call unreplayable (it may hold tensors of
# this call).
_CONSTANTS = (type(None), bool, int, float, str)


# Note [Model outputs pytree does not know]: transformers' model outputs (ModelOutput: an OrderedDict subclass that
# is a dataclass) are pytree nodes only since transformers 4.35, whose ModelOutput registers every subclass. Before,
# tree_flatten took the whole output for one leaf, neither a tensor nor a constant (Note [Output objects]), so no
# training step of a model from transformers 4.34 or older ever replayed: the stored run_image_classification.py
# needs transformers 4.24, and its ViT-base step ran per op (~2,100 ops, ~48 ms of emulator host a step, every step).
# An output that pytree leaves whole and that is a dict subclass and a dataclass is flattened as its items, in order,
# and rebuilt on replay as `cls(**items)`, as the later transformers do themselves.
_MAPPING_OUTPUT = "gpemu.mapping_output"


def _flatten_output(out: Any) -> tuple[list[Any], Any]:
    """tree_flatten, also through a dataclass mapping pytree does not know (Note [Model outputs pytree does not
    know])."""
    leaves, spec = tree_flatten(out)
    if (len(leaves) == 1 and leaves[0] is out and isinstance(out, dict) and type(out) is not dict
            and dataclasses.is_dataclass(out)):
        keys = tuple(out.keys())
        leaves, inner = tree_flatten([out[k] for k in keys])
        return leaves, (_MAPPING_OUTPUT, type(out), keys, inner)
    return leaves, spec


def _unflatten_output(leaves: list[Any], spec: Any) -> Any:
    """Inverse of _flatten_output."""
    if isinstance(spec, tuple) and len(spec) == 4 and spec[0] == _MAPPING_OUTPUT:
        _tag, cls, keys, inner = spec
        return cls(**dict(zip(keys, tree_unflatten(leaves, inner), strict=True)))
    return tree_unflatten(leaves, spec)


def _make_ready(entry: _Entry, rec: Recording) -> None:
    """Chunk `rec`'s ops for replay and make it the entry's replayable recording."""
    rec.fwd_chunks = _chunks(rec.fwd, "forward")
    rec.fwd_segments = _segments(rec)
    rec.bwd_chunks = _chunks(rec.bwd, "backward")
    entry.ready = rec


# Note [Alternating backwards]: a module called more than once before one backward pass (CycleGAN's generators:
# G_A(real_A), G_A(real_B) for the identity loss on two leaf inputs, one key; G_A(fake_A) for the cycle, another)
# uses each parameter several times, and autograd sums the contributions (an add per parameter, in the engine's input
# buffer or AccumulateGrad) inside whichever call's backward recording is open when they arrive. The two same-key
# recordings differ by those adds (the upstream ResNet-9 generator: 132 and 180 backward ops, 48 parameters) and
# alternate A, B, A, B, so no two consecutive ones matched and the module ran per op at every step: a local rewrite of
# CycleGAN's step read 72.1 ms of emulator host against 18.7 ms of GPU (session 15). A recording that matches the one
# two back, while the one between differs from it only by adds in its backward (same forward, same backward with
# add ops inserted), makes the variant without the adds replayable: a replayed backward adds each gradient into
# `.grad` itself (`grad.add_(g)`, Note [Direct gradients]), or the engine sums the returned gradients, so every call
# replayed from the plain variant charges those adds once, where they were charged before. In the test's two small
# generators the replayed steps then read the GPU time they read before this change (1,285.4 us on an A100), which
# is 6.4 % above the per-op steps' 1,208.5: the cross-generator call (its own key) was already replayed, and its
# recording holds the adds its replay makes again. Since session 16 a recording leaves out the adds of one call's
# gradient to another's (Note [Gradient sums across calls]): the same-key recordings match at once and every call
# replays from the third step at the per-op steps' 1,208.5 us; this rule stays for adds that rule does not see.
def _alternates(a: Recording, b: Recording) -> bool:
    """Return True when `a` and `b` ran the same forward and their backwards differ only by inserted add ops."""
    if a.fwd != b.fwd or a.out_meta != b.out_meta or a.reads != b.reads or len(a.bwd) == len(b.bwd):
        return False
    short, long = (a.bwd, b.bwd) if len(a.bwd) < len(b.bwd) else (b.bwd, a.bwd)
    i = 0
    for op in long:
        if i < len(short) and op == short[i]:
            i += 1
        elif not op[0].startswith("add"):
            return False
    return i == len(short)


# Note [New shapes]: a recording becomes replayable when two calls under one key (shapes, dtypes, modes, read values)
# ran the same ops at the same costs: the first call of a module may differ from later ones (lazy initialisation,
# a first-call branch). A module whose batches change shape (dynamic padding: each batch padded to its longest
# sequence) paid two per-op calls for every new shape. Once the module has a replayable recording under another key,
# a first recording whose ops are that recording's ops in the same order (names, reads, outputs; costs and memory
# follow the shape) is replayable at once: the module has shown it has no first-call difference.
def _like_a_sibling(entry: _Entry, rec: Recording) -> bool:
    """Return True when the module already replays under another key the same op sequence as `rec`."""
    if not entry.siblings:
        return False
    names: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    for other in entry.siblings.values():
        ready = other.ready
        if other is entry or ready is None or ready.stream_id != rec.stream_id or len(ready.fwd) != len(rec.fwd):
            continue
        if (len(ready.bwd) != len(rec.bwd) or len(ready.out_meta) != len(rec.out_meta)
                or [r[2] for r in ready.reads] != [r[2] for r in rec.reads] or ready.out_other.keys() != rec.out_other.keys()):
            continue
        if names is None:
            names = tuple(n for n, _s, _c in rec.fwd), tuple(n for n, _s, _c in rec.bwd)
        if names == (tuple(n for n, _s, _c in ready.fwd), tuple(n for n, _s, _c in ready.bwd)):
            return True
    return False


def _other_leaf(leaf: Any) -> tuple[bool, Any] | None:
    """Return (True, value) for a constant leaf, (False, factory) for an empty-constructible cache, else None."""
    if isinstance(leaf, _CONSTANTS):
        return True, leaf
    cls = type(leaf)
    if any(c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in cls.__mro__):
        try:
            cls()
        except Exception:  # a cache that needs arguments: an encoder-decoder pair of caches, or not rebuilt
            return _pair_cache(leaf, cls)
        return False, cls
    return None


def _pair_cache(leaf: Any, cls: type) -> tuple[bool, Any] | None:
    """Return (False, factory) for a cache built from two empty-constructible caches (transformers'
    EncoderDecoderCache of T5, BART, Whisper: Note [Output objects]), else None (StaticCache: not rebuilt)."""
    parts = [_other_leaf(getattr(leaf, name, None)) for name in ("self_attention_cache", "cross_attention_cache")]
    if any(p is None or p[0] for p in parts):
        return None
    make_self, make_cross = (p[1] for p in parts if p is not None)

    def factory() -> Any:
        return cls(make_self(), make_cross())

    try:
        factory()
    except Exception:
        return None
    return False, factory


# Note [Direct gradients]: returning a parameter's gradient from the replayed backward makes autograd run its
# AccumulateGrad node, which on a fresh gradient calls `detach()` (one more Python dispatch and wrapper per
# parameter, ~40% of a replayed backward). When nothing can observe that node - no hooks on the parameter, no
# torch.distributed process group (DDP hooks the accumulators), no double backward - the replayed backward does
# what AccumulateGrad would: sets `.grad` to the new gradient, or adds into an existing one (that add is a real op,
# charged as on the per-op path, whose recording excluded AccumulateGrad's ops). Only where the engine would run
# that AccumulateGrad node (torch._C._will_engine_execute_node): `backward(inputs=...)` leaves other parameters'
# `.grad` alone (and their gradients are not built at all), and `torch.autograd.grad(loss, params)` (where that
# check raises) must get the gradients back from the engine and leave every `.grad` alone. The gradients set here
# die together at zero_grad(), so they are built as block wrappers (Note [Block wrappers] in tensor.py); those
# returned to the engine are built one by one (fresh_on). _GradPlan caches which is which per pattern.


# Note [Detached parameters]: even when the replayed backward sets every `.grad` itself (Note [Direct gradients]), each
# parameter is an argument of the replayed autograd.Function, so the engine still visits each parameter's
# AccumulateGrad node with an undefined gradient: ~2.6 us per parameter on this host (a Function with 161 parameter
# arguments: 467 us per backward against 49 us with none), a fifth of a replayed resnet50 step. Once a recording's
# replayed backward has been a plain one (every parameter that requires grad got its `.grad` here), later calls
# under direct gradients leave the parameters out of the Function's arguments and pass one fresh leaf, the token, in
# their place: the outputs require grad through it, and in backward its AccumulateGrad (the only one left) tells a
# plain `backward()` (it runs: every parameter gets its `.grad`) from `backward(inputs=...)` or
# `torch.autograd.grad()` of other tensors (it does not run: no parameter gradient is built). A call that names one
# of those parameters as an input would find it unreachable (autograd.grad raises "One of the differentiated Tensors
# appears to not have been used in the graph", and backward(inputs=...) skips it), so gpemu's wrapper of
# torch.autograd's `_engine_run_backward` (every backward() and grad() goes through it) adds the tokens of the live
# detached replays whose parameters it names to the inputs, tells the replayed backward which parameters were asked
# for, and returns their gradients where autograd.grad() puts them (backward(inputs=...) gets them as `.grad`).
# Parameter hooks, DDP (a process group) and a forward-only recording keep the parameters as arguments.
class _Detached:
    """A replayed call whose parameters are not Function arguments (Note [Detached parameters])."""

    __slots__ = ("__weakref__", "params", "requires_grad", "token")

    def __init__(self, params: tuple[torch.nn.Parameter, ...], token: torch.Tensor,
                 requires_grad: tuple[bool, ...]) -> None:
        self.params = params
        self.token = token
        self.requires_grad = requires_grad


_live_detached: weakref.WeakSet[_Detached] = weakref.WeakSet()  # alive while their autograd graph is
_TOKEN_BASE = torch.empty(0, device="cpu")


class _Rescue(threading.local):
    """What the engine wrapper asks of the replayed backwards it runs (Note [Detached parameters])."""

    requested: set[int] | None = None  # ids of the detached parameters named as inputs
    capture: dict[int, torch.Tensor] | None = None  # autograd.grad(): their gradients, by parameter id


_rescue = _Rescue()


def patch_engine_inputs(patcher: Any) -> None:
    """Wrap torch.autograd's `_engine_run_backward` so that backward(inputs=...) and autograd.grad() of parameters
    of a detached replay reach them (Note [Detached parameters])."""
    orig = torch.autograd._engine_run_backward

    def _engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not _live_detached:
            return orig(t_outputs, *args, **kwargs)
        inputs = (args[3] if len(args) > 3 else kwargs.get("inputs")) or ()  # run_backward's 5th argument
        ids = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
        dets = [d for d in list(_live_detached) if any(id(p) in ids for p in d.params)] if ids else []
        previous = _rescue.requested, _rescue.capture
        if not dets:
            if previous == (None, None):
                return orig(t_outputs, *args, **kwargs)
            _rescue.requested = _rescue.capture = None  # an engine run nested in a rescued one asks nothing of it
            try:
                return orig(t_outputs, *args, **kwargs)
            finally:
                _rescue.requested, _rescue.capture = previous
        names = ("grad_tensors", "keep_graph", "create_graph", "inputs", "allow_unreachable", "accumulate_grad")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        requested = {id(p) for d in dets for p in d.params} & ids
        accumulate = bool(bound.get("accumulate_grad", False))
        allow = bool(bound.get("allow_unreachable", False))
        bound["inputs"] = (*inputs, *(d.token for d in dets))
        bound["allow_unreachable"] = True
        _rescue.requested, _rescue.capture = requested, (None if accumulate else {})
        try:
            result = orig(t_outputs, bound.pop("grad_tensors"), bound.pop("keep_graph"), bound.pop("create_graph"),
                          **bound)
            capture = _rescue.capture
        finally:
            _rescue.requested, _rescue.capture = previous
        if accumulate:
            return result
        out = list(result[:len(inputs)])
        for i, t in enumerate(inputs):
            if out[i] is None and capture is not None and id(t) in capture:
                out[i] = capture[id(t)]
        if not allow and any(g is None for g in out):
            raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                               "Set allow_unused=True if this is the desired behavior.")
        return tuple(out)

    patcher.set(torch.autograd, "_engine_run_backward", _engine_run_backward)


def _distributed() -> bool:
    """Return True when a torch.distributed process group exists (DDP may hook the gradient accumulators)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _params_if_hook_free(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Return module.parameters() as a list, or [] when a module hook (other than gpemu's phase hooks) could observe
    the module's forward/backward."""
    walk = _walk(module)
    return walk[0] if walk is not None else []


# Note [Hooks that do not change a step]: a module hook could observe or change a forward, so a model with one is
# never replayed. Some are known not to change which kernels run or what they cost: transformers'
# `enable_input_require_grads()` (called by `gradient_checkpointing_enable()` and by PEFT/LoRA set-ups) registers
# `make_inputs_require_grads` on the input embeddings, which only sets `requires_grad` on the embedding output so
# that checkpointed blocks see a grad-requiring input. Its effect is in the recording (the ops the backward ran and
# the output's requires_grad), so a replay that skips it charges the same step. Hooks gpemu does not know keep the
# model on the per-op path.
_NEUTRAL_HOOKS = frozenset({("transformers", "make_inputs_require_grads")})


def _neutral_hook(hook: Any) -> bool:
    """Return True for a module forward hook known not to change a step (Note [Hooks that do not change a step])."""
    package = (getattr(hook, "__module__", None) or "").partition(".")[0]
    return (package, getattr(hook, "__name__", "")) in _NEUTRAL_HOOKS


# Note [Module structure cache]: which parameters a top module has (and their shapes, strides and dtypes: a model moved
# to channels_last keeps its parameter objects but runs other kernels), whether a module or parameter hook could
# observe it, and the submodules' flags (`training`) decide replay, and finding out walks every submodule (resnet50:
# 161 modules, ~0.3 ms, a tenth of a replayed step). The walk's answer is cached per top module and trusted while the
# structure generation below is unchanged. gpemu bumps it on every way torch offers to change that answer while
# installed: Module.__setattr__ of a parameter, a module, None over either, or a bool (the module flags that choose
# its ops join the key: `training`, which train()/eval() set, transformers' `gradient_checkpointing`, `inplace`),
# __delattr__, register_parameter, add_module/register_module, _apply (.to()/.cuda()/.half() may replace parameter
# objects), module hook registration, tensor hook registration and the removal of any hook (RemovableHandle.remove).
# requires_grad is a C attribute that no Python patch sees, so it is read per call (one list over the parameters).
# Not seen: writes straight into a module's `_parameters` / `_modules` / hook dicts after the first forward (torch's
# own utilities go through the methods above); GPEMU_REPLAY=0 is the way out for code that does that.
_structure_gen = 0


def structure_changed() -> None:
    """Invalidate every cached module walk (Note [Module structure cache])."""
    global _structure_gen
    _structure_gen += 1




def patch_structure_changes(patcher: Any) -> None:
    """Make the ways of changing a module's parameters, submodules, flags or hooks bump the structure
    generation, through `patcher` (Note [Module structure cache])."""
    module_cls = torch.nn.Module
    orig_setattr = module_cls.__setattr__

    def __setattr__(self: torch.nn.Module, name: str, value: Any) -> None:
        if type(value) is bool:  # a flag: only a change counts (the transformers Trainer calls train() every step)
            changed = self.__dict__.get(name) is not value
            orig_setattr(self, name, value)  # type: ignore[arg-type]
            if changed:
                structure_changed()
            return
        orig_setattr(self, name, value)
        # (None over a parameter or a module too). Through __dict__, as torch's own __setattr__ reads them: a subclass
        # may set plain attributes before Module.__init__ made them (transformers 4.x OPTLearnedPositionalEmbedding
        # sets `self.offset = 2` first; a RecursiveScriptModule sets `_c`: Note [Scripted modules]), and `self._parameters`
        # then raised AttributeError under gpemu alone
        d = self.__dict__
        if (isinstance(value, (torch.nn.Module, torch.nn.Parameter))
                or name in d.get("_parameters", ()) or name in d.get("_modules", ())):
            structure_changed()

    patcher.set(module_cls, "__setattr__", __setattr__)

    def bumping(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                structure_changed()

        return wrapper

    for name in ("__delattr__", "register_parameter", "add_module", "register_module", "_apply",
                 "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                 "register_full_backward_pre_hook", "register_backward_hook"):
        patcher.set(module_cls, name, bumping(getattr(module_cls, name)))
    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        patcher.set(torch.Tensor, name, bumping(getattr(torch.Tensor, name)))
    handle_cls = torch.utils.hooks.RemovableHandle
    patcher.set(handle_cls, "remove", bumping(handle_cls.remove))
    structure_changed()  # what changed while gpemu was not installed was not counted


@dataclass
class _Structure:
    """One cached walk of a top module (Note [Module structure cache]): None fields when it must not replay."""

    gen: int
    params: list[torch.nn.Parameter] | None
    key: tuple[Any, ...]  # parameter ids and metadata, submodule flags, whether a parameter has a post-accumulate hook
    hook_free: bool


_structures: weakref.WeakKeyDictionary[torch.nn.Module, _Structure] = weakref.WeakKeyDictionary()


def _walk(module: torch.nn.Module) -> tuple[list[torch.nn.Parameter], tuple[Any, ...], bool] | None:
    """Return (module.parameters() as a list, their part of the replay key, whether no parameter has a gradient
    hook: Note [Direct gradients]), or None when the module has no parameters or a module hook (other than gpemu's
    phase hooks) could observe its forward/backward. The structure comes from the cache while nothing changed it
    (Note [Module structure cache]); requires_grad is read on every call."""
    m = _nn_module
    if m._global_backward_hooks or m._global_backward_pre_hooks:
        return None
    if len(m._global_forward_hooks) > 1 or len(m._global_forward_pre_hooks) > 1:
        return None
    got = _structures.get(module)
    if got is None or got.gen != _structure_gen:
        got = _structures[module] = _walk_structure(module)
    params = got.params
    if params is None:
        return None
    return params, (got.key, tuple([p.requires_grad for p in params])), got.hook_free


def all_require_grad(module: torch.nn.Module) -> bool:
    """Return True when every parameter of `module` requires grad (its parameters from the structure cache, Note
    [Module structure cache]; ~5 us for resnet50's 161 where module.parameters() walks ~100 us)."""
    got = _structures.get(module)
    if got is None or got.gen != _structure_gen:
        got = _structures[module] = _walk_structure(module)
    if got.params is None:
        return True
    with _plain_attrs():  # See Note [Tensor attributes from Python]
        return all([p.requires_grad for p in got.params])


# Note [Gradients consumed in backward]: a post-accumulate-grad hook on a parameter runs right after its gradient
# lands, and may consume it: an optimizer step per parameter with the gradient freed at once (pytorch/tutorials
# optimizer_step_in_backward, torchtune's optimizer-in-backward), so gradients never all exist together. A replayed
# backward makes every parameter's gradient at once, as the one autograd node it is, before the hooks run: the
# ViT-L tutorial peaked at 4.55 GiB replayed vs 3.75 GiB per op (the tutorial's "~4GB" on a GPU). Whether
# parameters have such hooks joins the replay key (hooks registered after a recording was made record anew), and a
# recording whose backward left a hooked parameter without its gradient is never replayed: that module stays on
# the per-op path. Hooks that only look at the gradient (logging) still replay.
def _grads_consumed(params: list[torch.nn.Parameter]) -> bool:
    """Return True when a parameter with a post-accumulate-grad hook that requires grad has no .grad."""
    return any(p._post_accumulate_grad_hooks and p.requires_grad and p.grad is None for p in params)


def _walk_structure(module: torch.nn.Module) -> _Structure:
    """Walk the submodules once: parameters in module.parameters()' order, ids, module flags and hooks."""
    gen = _structure_gen
    params: list[torch.nn.Parameter] = []
    key: list[Any] = []  # id and metadata per parameter, then the bool flags per module
    seen: set[int] = set()
    hook_free = True
    post_hooked = False  # a parameter has a post-accumulate-grad hook: it joins the key
    # module.modules()' pre-order and de-duplication, without named_modules' prefix strings
    stack = [module]
    visited: set[int] = set()
    flags: list[tuple[tuple[str, bool], ...]] = []
    while stack:
        sub = stack.pop()
        if id(sub) in visited:
            continue
        visited.add(id(sub))
        if sub.__dict__.get("sparse") is True and "Embedding" in type(sub).__name__:
            return _Structure(gen, None, (), False)  # sparse gradients: never replayed (Note [Sparse tensors])
        if (sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks or sub._backward_pre_hooks) and (
                sub._forward_pre_hooks or sub._backward_hooks or sub._backward_pre_hooks
                or not all(_neutral_hook(h) for h in sub._forward_hooks.values())):
            return _Structure(gen, None, (), False)
        # the module's flags (`training`, `gradient_checkpointing`, an activation's `inplace`): they choose its ops
        flags.append(tuple([(k, v) for k, v in sub.__dict__.items() if type(v) is bool]))
        for p in sub._parameters.values():  # the order and de-duplication of module.parameters()
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
                key.append(id(p))
                key.append(getattr(p, "_mk", None))  # shape, strides, dtype: .to(memory_format=...) keeps the object
                if p._post_accumulate_grad_hooks:  # See Note [Gradients consumed in backward]
                    post_hooked = True
                if hook_free and (p._backward_hooks or p._post_accumulate_grad_hooks):
                    hook_free = False
        children = sub._modules
        if children:
            stack.extend([c for c in reversed(children.values()) if c is not None])
    if not params:
        return _Structure(gen, None, (), False)
    return _Structure(gen, params, (tuple(key), tuple(flags), post_hooked), hook_free)


def _replays_inside(top: torch.nn.Module, module: torch.nn.Module) -> bool:
    """Return True when `module` is the network inside a one-rank emulated DDP (Note [DDP on one rank]): its
    forward and backward replay like a top module's, while DDP's Reducer hooks (on AccumulateGrad, which replay
    leaves per op) still copy gradients into the bucket and all-reduce it."""
    if type(top).__name__ != "DistributedDataParallel" or getattr(top, "module", None) is not module:
        return False
    from gpemu.distributed.ddp import is_emulated_reducer

    return is_emulated_reducer(getattr(top, "reducer", None))


_in_backward = torch._C._current_autograd_node


# Note [Modules called in backward]: activation checkpointing (torch.utils.checkpoint, Hugging Face's
# gradient_checkpointing_enable()) runs a block's forward again inside backward. No top module is open then, so the
# block looked like a new top-level call: the phase tracker opened a new step with a "forward" phase in the middle
# of backward, and the replayer recorded the block on its own, while the real top module (whose backward contains the
# recomputation) never matched two recordings. A module called while the autograd engine runs a node in this thread
# is part of that backward: it is never a top module.


def patch_module_call(emu: Any, patcher: Any) -> None:
    """Route top-level module calls through the Replayer (see Note [Replay path])."""
    orig = torch.nn.Module.__call__

    def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        phases = emu.phases
        top = phases.top
        if top is None and _in_backward() is not None:  # See Note [Modules called in backward]
            return orig(self, *args, **kwargs)
        if top is None:
            phases.pending_kwargs = (self, kwargs) if kwargs else None  # See Note [Keyword inputs] in phases.py
        rp = emu.replay
        if rp is None or (top is not None and not _replays_inside(top, self)):
            return orig(self, *args, **kwargs)
        return rp.call(orig, self, args, kwargs)

    patcher.set(torch.nn.Module, "__call__", __call__)
    patch_structure_changes(patcher)
    patch_engine_inputs(patcher)
