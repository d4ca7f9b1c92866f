"""Optimizer-step replay: after two identical steps, `optimizer.step()` is charged as a unit without its Python.

Note [Optimizer replay]: with the model replayed (Note [Replay path]), torch's optimizer is the largest host cost
left in a training step: its Python and foreach argument handling visit every parameter (resnet50, SGD momentum:
~1.5 ms of ~6 ms per step), none of which computes anything on an emulated GPU. gpemu wraps the optimizer class's
step *inside* torch's hook wrapper (`Optimizer.profile_hook_step`, so step pre/post hooks, `_optimizer_step_code`
and LR schedulers' step counting still run) and, per optimizer instance:
- keys each call on what decides torch's op stream: per param group, which parameters have a gradient and their
  metadata, and each hyper-parameter other than lr reduced to its branch (zero / non-zero, bool, None): schedulers
  change lr, momentum and betas every step without changing the ops;
- records a call (the costs charged, memory at the end and the transient peak above the start, no host syncs, no
  copies) and, once two consecutive calls with one key recorded the same costs and left memory unchanged (steady
  state: optimizer state already allocated), charges later calls as at most 4 work items with the same transient
  memory, and advances the CPU `step` counters torch would have advanced (Adam's `state["step"]`).
It never replays a call with a closure (LBFGS), sparse gradients, or when any parameter or gradient is not on the
emulated GPU; GPEMU_REPLAY=0 disables it with the module replay. Values are never computed either way, so the
emulated parameters, moments and gradients are unchanged by a replayed step exactly as by a recorded one.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpemu.torch_backend import state
from gpemu.torch_backend import tensor as emu_tensor
from gpemu.torch_backend.replay import Chunk, _charge_chunks, _chunks, _plain_attrs, _Window
from gpemu.torch_backend.tensor import EmuTensor


@dataclass
class _StepRecord:
    ops: list[tuple[str, float, str]] = field(default_factory=list)
    index: int = -1
    end_delta_bytes: int = 0
    transient_bytes: int = 0
    clean: bool = True


@dataclass
class _Entry:
    key: Any = None
    last: _StepRecord | None = None
    ready: list[Chunk] | None = None
    ready_ops: list[tuple[str, float, str]] | None = None
    transient_bytes: int = 0
    index: int = 0


_entries: weakref.WeakKeyDictionary[Any, _Entry] = weakref.WeakKeyDictionary()
replayed_steps = 0  # for tests and the host-overhead bench


def _branch(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, (tuple, list)):
        return tuple(_branch(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.device.type, tuple(value.shape))
    return type(value).__name__


_NONE_TYPE = type(None)


def _key(optimizer: Any) -> Any:
    """Return the structural key of one step, or None when it must not be replayed."""
    parts = []
    for group in optimizer.param_groups:
        ps = group["params"]
        grads = [p.grad for p in ps]
        # every parameter and gradient an EmuTensor (sparse gradients are EmuTensors too, never replayed); set() of
        # the types, not an isinstance per tensor (resnet50: 161 parameters, ~0.1 ms a step). See Note [Host overhead]
        if (not set(map(type, ps)) <= _EMU_TYPES or not set(map(type, grads)) <= _GRAD_TYPES) and (
                not all(isinstance(p, EmuTensor) for p in ps)
                or not all(g is None or isinstance(g, EmuTensor) for g in grads)):
            return None
        mks = tuple([None if g is None else g._mk for g in grads])
        if None in mks and any(g is not None and g.layout is not torch.strided for g in grads):
            return None  # a sparse gradient: its nnz, and so the step's cost, changes (Note [Sparse tensors])
        hyper = tuple(sorted((k, _branch(v)) for k, v in group.items() if k not in ("params", "lr", "initial_lr")))
        parts.append((tuple(map(id, ps)), mks, hyper))
    return tuple(parts)


_EMU_TYPES = frozenset({EmuTensor})
_GRAD_TYPES = frozenset({EmuTensor, _NONE_TYPE})


def _record(entry: _Entry, key: Any, run: Callable[[], Any]) -> Any:
    """Run the real step while recording what it charged; update the entry; return the step's result."""
    emu = state.require()
    device_index = emu.current_device()
    window = _Window(emu.devices[device_index])
    rec = _StepRecord(index=device_index)

    def sink(index: int, name: str, predicted_s: float, category: str, stream_id: int) -> None:
        if index != rec.index or stream_id != emu.current_stream(index).stream_id:
            rec.clean = False
        rec.ops.append((name, predicted_s, category))

    previous, emu_tensor.record_sink = emu_tensor.record_sink, sink
    try:
        out = run()
    finally:
        emu_tensor.record_sink = previous
    end, peak = window.close()
    rec.end_delta_bytes = end - window.start
    rec.transient_bytes = max(0, peak - max(end, window.start))
    rec.clean = rec.clean and previous is None and window.clean(len(rec.ops))
    last = entry.last if entry.key == key else None
    entry.key, entry.last, entry.ready = key, rec, None
    if (last is not None and rec.clean and last.clean and rec.end_delta_bytes == 0 and last.end_delta_bytes == 0
            and rec.ops == last.ops and rec.ops):
        entry.ready, entry.ready_ops = _chunks(rec.ops, "optimizer"), rec.ops
        entry.transient_bytes, entry.index = rec.transient_bytes, rec.index
    return out


def _replay(optimizer: Any, entry: _Entry) -> None:
    global replayed_steps
    emu = state.require()
    assert entry.ready is not None
    alloc = emu.devices[entry.index].allocator
    stream_id = emu.current_stream(entry.index).pool_id  # the allocator pool (Note [CUDA graphs])
    tmp = alloc.malloc(entry.transient_bytes, stream_id, "replay: optimizer temporaries") if (
        entry.transient_bytes > 0) else None
    _charge_chunks(emu, entry.index, entry.ready)
    if tmp is not None:
        alloc.free(tmp)
    # .is_cpu, not .device.type == "cpu" (a device object per parameter); an emulated step counter is not on cpu
    steps = [s["step"] for s in optimizer.state.values() if isinstance(s.get("step"), torch.Tensor) and s["step"].is_cpu]
    if steps:
        torch._foreach_add_(steps, 1)  # what the optimizer's own step would have done on the host
    replayed_steps += 1


def _has_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Return True when step() got a closure (LBFGS: never replayed) or any other argument. `closure=None` passed on
    explicitly is none: GradScaler.step(opt, None), as accelerate's AcceleratedOptimizer calls it under the
    transformers Trainer, kept every Trainer step off the replay."""
    if not args and not kwargs:
        return False
    if len(args) + len(kwargs) > 1:
        return True
    return (args[0] if args else kwargs.get("closure", True)) is not None


def replaying(step: Callable[..., Any]) -> Callable[..., Any]:
    """Return an optimizer-class `step` that replays steady-state steps (see Note [Optimizer replay])."""
    if getattr(step, "_gpemu_replaying", False):
        return step

    @functools.wraps(step)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        emu = state.current_emulation()
        if emu is None or emu.replay is None or _has_arguments(args, kwargs):
            return step(self, *args, **kwargs)
        with _plain_attrs():  # See Note [Tensor attributes from Python] in replay.py
            key = _key(self)
        if key is None:
            _entries.pop(self, None)
            return step(self, *args, **kwargs)
        entry = _entries.get(self)
        if entry is None:
            entry = _entries[self] = _Entry()
        if entry.ready is not None and entry.key == key:
            with _plain_attrs():
                _replay(self, entry)
            return None
        return _record(entry, key, lambda: step(self, *args, **kwargs))

    wrapper._gpemu_replaying = True  # type: ignore[attr-defined]
    return wrapper


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _plain_zero_grad(zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    """Return Optimizer.zero_grad run under DisableTorchFunctionSubclass when every parameter is an EmuTensor: its
    `p.grad` reads and writes skip the `__torch_function__` look-up EmuTensor disables anyway (Note [Tensor
    attributes from Python] in replay.py; resnet50: 322 of them a step). Parameters of any other type (a subclass
    with its own __torch_function__) keep torch's path."""

    @functools.wraps(zero_grad)
    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        if all(set(map(type, group["params"])) <= _EMU_TYPES for group in self.param_groups):
            with _plain_attrs():
                return zero_grad(self, *args, **kwargs)
        return zero_grad(self, *args, **kwargs)

    return _releasing_zero_grad(plain)


def release_dropped_grads() -> None:
    """Free the replayed gradients zero_grad() just dropped (Note [Recycled gradients] in replay.py)."""
    emu = state.current_emulation()
    replayer = emu.replay if emu is not None else None
    if replayer is not None and replayer.armed:
        replayer.release_grads()


def _releasing_zero_grad(zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    """Return Module.zero_grad followed by release_dropped_grads()."""

    @functools.wraps(zero_grad)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return zero_grad(self, *args, **kwargs)
        finally:
            release_dropped_grads()

    return wrapper


def apply(patcher: Any) -> None:
    """Make optimizer classes replay their steady-state steps, through `patcher`: classes torch hooks from now on,
    and classes it already hooked (their step is re-wrapped around the original function)."""
    from torch.optim.optimizer import Optimizer

    patcher.set(Optimizer, "zero_grad", _plain_zero_grad(Optimizer.zero_grad))
    patcher.set(torch.nn.Module, "zero_grad", _releasing_zero_grad(torch.nn.Module.zero_grad))

    original = Optimizer.profile_hook_step

    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        return original(replaying(func))

    patcher.set(Optimizer, "profile_hook_step", staticmethod(profile_hook_step))
    for cls in _subclasses(Optimizer):
        hooked = cls.__dict__.get("step")
        inner = getattr(hooked, "__wrapped__", None)
        if getattr(hooked, "hooked", False) and inner is not None and not getattr(inner, "_gpemu_replaying", False):
            rewrapped = original(replaying(inner))
            rewrapped.hooked = True  # type: ignore[attr-defined]
            patcher.set(cls, "step", rewrapped)
