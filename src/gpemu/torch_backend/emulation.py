"""install() / uninstall(): make emulated GPUs the `cuda:N` devices of an unmodified PyTorch program."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
from pathlib import Path
from typing import Any

import torch

from gpemu.device import EmulatedGPU, TraceRecorder
from gpemu.errors import GpemuError
from gpemu.hardware import get_gpu
from gpemu.torch_backend import (
    autocast,
    data_parallel,
    dropout,
    ipc,
    module_move,
    nested,
    optim_replay,
    rnn,
    sdpa,
    sparse,  # noqa: F401 (imported for its op handlers: Note [Sparse tensors])
    spectral,  # noqa: F401 (imported for its op handlers: Note [Half-precision FFT sizes])
    state,
)
from gpemu.torch_backend.autocast import release_casts
from gpemu.torch_backend.patches import Patcher, apply
from gpemu.torch_backend.phases import PhaseLookup, PhaseTracker, model_from_env
from gpemu.torch_backend.replay import Replayer, patch_module_call, replay_enabled_from_env
from gpemu.torch_backend.state import Emulation, ValueHook
from gpemu.units import parse_size

_patcher: Patcher | None = None
def parse_bytes(text: str) -> int:
    """Return a byte count from "12345", "10GiB", "512 MiB" or "16GB" (see gpemu.units.parse_size)."""
    return parse_size(text)


# Note [Older torch releases]
# pyproject asks for torch >= 2.6 and gpemu reaches into torch internals that change between releases, so each use
# that differs is feature-detected once (at import or install, never per op) and the older path kept:
#  - tensor.py's view fast path calls `OpOverload._op` directly unless a Python kernel is registered, which torch
#    2.14 tells with `_pyobj_dispatcher`; before 2.14 that attribute does not exist and `OpOverload.__call__` is
#    always `self._op(...)`, so `_HAS_PYOBJ_DISPATCHER` (read once at import) says whether to look.
#  - torch.profiler: from 2.12 `_KinetoProfile.__init__` parses `activities` (which may hold {activity: [names]}
#    filters) in `profiler._parse_activities`, which profiling.py patches to leave CUDA out; 2.11 and older have no
#    such function and take `set(activities)` in `__init__`, so the patched `__init__` leaves CUDA out there itself.
#  - the torch.profiler patches are optional (`Patcher.optional`): should a later release break them, they are
#    undone and named in one stderr line, and everything else is installed.
#  - any other failure in install() undoes every patch applied so far before the error propagates. With torch 2.11
#    the profiler patch raised AttributeError after the Tensor methods, factories and torch.cuda were patched: `gpemu
#    run` said the script ran "WITHOUT GPU emulation", yet `.cuda()` still made emulated tensors, which then crashed.
# A CPU-only build (`+cpu`) differs too: its torch.cuda.nvtx raises (Note [NVTX without a CUDA build] in nvtx.py).
# tests/torch_backend/test_older_torch.py simulates the missing attributes on the current torch.
def install(
    gpu: str = "v100",
    count: int = 1,
    model: str | None = None,
    memory_limit_bytes: int | None = None,
    trace: TraceRecorder | None = None,
    *,
    profile_lookup: PhaseLookup | None = None,
    value_hook: ValueHook | None = None,
    nonzero_fraction: float | None = None,
    replay: bool | None = None,
    float_value: float | None = None,
) -> Emulation:
    """Patch torch so `cuda:0..count-1` are emulated `gpu`s; return the Emulation (devices, stats, trace).

    `replay` (default: GPEMU_REPLAY, on unless "0") enables the whole-module replay path; see Note [Replay path].
    `float_value` (default: GPEMU_FLOAT_VALUE, else 0) is what computed floating-point values read back as.
    """
    global _patcher
    if state.current_emulation() is not None:
        uninstall()
    spec = get_gpu(gpu)
    if count < 1:
        raise GpemuError(f"count must be >= 1 (got {count})")
    devices = [EmulatedGPU(spec, i, trace=trace, memory_limit_bytes=memory_limit_bytes) for i in range(count)]
    if nonzero_fraction is None:
        nonzero_fraction = float(os.environ.get("GPEMU_NONZERO_FRACTION", "1.0"))
    if float_value is None:
        float_value = float(os.environ.get("GPEMU_FLOAT_VALUE", "0"))
    emu = Emulation(devices, trace=trace, model=model, value_hook=value_hook, nonzero_fraction=nonzero_fraction,
                    float_value=float_value)
    emu.phases = PhaseTracker(spec.key, model, profile_lookup)
    state._set_current(emu)
    _patcher = Patcher()
    try:
        _install_patches(emu, _patcher, replay)
    except BaseException:
        # Note [Older torch releases]: nothing may stay half-installed; the script then runs without emulation
        with contextlib.suppress(Exception):
            uninstall()
        state._set_current(None)
        _patcher = None
        raise
    return emu


def _install_patches(emu: Emulation, patcher: Patcher, replay: bool | None) -> None:
    """Apply every patch of install() through `patcher` and warm the emulation up."""
    devices = emu.devices
    apply(emu, patcher)
    rnn.apply(patcher)
    ipc.apply(patcher)
    data_parallel.apply(patcher)
    module_move.apply(patcher)
    sdpa.apply(patcher)
    nested.apply(patcher)
    dropout.apply(patcher)
    _patch_autocast(patcher, emu)
    autocast.apply(patcher)
    if replay if replay is not None else replay_enabled_from_env():
        emu.replay = Replayer(emu)
    optim_replay.apply(patcher)
    patch_module_call(emu, patcher)
    emu.phases.install()
    from gpemu.torch_backend.tensor import WaitsInsideOps, check_fp32_modes, clear_op_caches

    clear_op_caches()  # costs cached by an earlier emulation priced its GPU (Note [Caches per emulation])
    check_fp32_modes()  # costs cached under other TF32 flags are dropped (Note [FP32 math modes])

    waits = WaitsInsideOps()
    for dev in devices:
        dev.add_listener(waits)
    emu.phases.warm()
    gc.collect()
    gc.freeze()  # See Note [Host overhead]: keep the collector from rescanning torch's long-lived objects


def uninstall() -> None:
    """Restore every patched torch attribute and drop the emulation (emulated tensors become unusable)."""
    global _patcher
    emu = state.current_emulation()
    if emu is not None and emu.phases is not None:
        emu.phases.uninstall()
    import torch.utils._device as device_mod

    if getattr(device_mod.CURRENT_DEVICE, "type", None) == "cuda":  # set_default_device("cuda") must not outlive us
        torch.set_default_device(None)
    if _patcher is not None:
        _patcher.restore()
        _patcher = None
    state._set_current(None)
    from gpemu.torch_backend import cuda_api

    cuda_api.reset_state()
    gc.unfreeze()


def current_emulation() -> Emulation | None:
    """Return the installed Emulation, or None."""
    return state.current_emulation()


def set_value_hook(fn: ValueHook | None) -> None:
    """Set the function that supplies values for `.item()`/`.cpu()` (fn(shape, dtype, reason) -> value or None)."""
    state.require().value_hook = fn


def install_from_env() -> Emulation:
    """Install from GPEMU_GPU, GPEMU_COUNT, GPEMU_MODEL, GPEMU_MEMORY_LIMIT and GPEMU_TRACE (written at exit)."""
    limit = os.environ.get("GPEMU_MEMORY_LIMIT")
    trace_path = os.environ.get("GPEMU_TRACE")
    trace = TraceRecorder() if trace_path else None
    emu = install(
        gpu=os.environ.get("GPEMU_GPU", "v100"),
        count=int(os.environ.get("GPEMU_COUNT", "1")),
        model=model_from_env(),
        memory_limit_bytes=parse_bytes(limit) if limit else None,
        trace=trace,
    )
    if trace is not None and trace_path:
        atexit.register(write_trace_unless_idle, trace, trace_path)
    _hint_on_zero_values()
    return emu


def write_trace_unless_idle(trace: TraceRecorder, path: str) -> bool:
    """Write `trace` to `path` at exit; return False (and keep the file) when this process recorded nothing and the
    file exists: a launcher (torchrun's agent, a shell-out wrapper) exits after the worker that wrote the trace."""
    if not trace.events and not trace.dropped and Path(path).exists():
        return False
    trace.write(path)
    return True


def _hint_on_zero_values() -> None:
    """Wrap sys.excepthook: a script killed by arithmetic on an emulated value (1 / loss.item() with the default
    0) gets one line naming GPEMU_FLOAT_VALUE after its traceback."""
    import sys

    original = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        original(exc_type, exc, tb)
        math_error = issubclass(exc_type, ZeroDivisionError) or (
            issubclass(exc_type, ValueError) and "math domain" in str(exc))
        current = state.current_emulation()
        if math_error and current is not None and current.float_value == 0.0:
            print("gpemu: values computed on the emulated GPU read back as 0 (no arithmetic is emulated); if the "
                  "script divides by or takes the log of such a value, rerun with GPEMU_FLOAT_VALUE=1 "
                  "(docs/drop-in.md, Values)", file=sys.stderr)

    hook.__wrapped__ = original  # type: ignore[attr-defined]
    sys.excepthook = hook


def _patch_autocast(patcher: Patcher, emu: Emulation) -> None:
    """Mark autocast("cuda") use so dtype emulation switches on (see Note [Autocast on meta])."""
    orig_enter, orig_exit = torch.autocast.__enter__, torch.autocast.__exit__

    def __enter__(self: torch.autocast) -> None:
        if self.device == "cuda":
            emu.autocast_seen = emu.autocast_seen or bool(self._enabled)
            if not emu.autocast_stack():  # a new outermost region: copies of a graph never backpropagated are gone
                release_casts()
            emu.autocast_stack().append(self.fast_dtype if self._enabled else None)
        return orig_enter(self)

    def __exit__(self: torch.autocast, *exc: object) -> None:
        if self.device == "cuda" and emu.autocast_stack():
            emu.autocast_stack().pop()
            if not emu.autocast_stack() and not torch.is_grad_enabled():  # inference: nothing saved them
                release_casts()
        return orig_exit(self, *exc)  # type: ignore[arg-type]

    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        out = original_backward(*args, **kwargs)
        release_casts()  # See Note [Autocast casts take memory]: backward consumed the saved copies
        return out

    patcher.set(torch.autocast, "__enter__", __enter__)
    patcher.set(torch.autocast, "__exit__", __exit__)
    patcher.set(torch.autograd, "backward", functools.wraps(original_backward)(backward))
