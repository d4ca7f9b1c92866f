"""torch.profiler under emulation: kineto records host activity; the emulated GPU's work is added as CUDA events.

A driverless build asked for ProfilerActivity.CUDA falls back to recording CUDA events around every op and prints a
multi-line C++ stack trace per op ("Failed to record CUDA event"). Under gpemu kineto records CPU activity only, and
the emulated kernels and copies launched while the profiler ran are added to its results (Note [Emulated kernels in
torch.profiler]); the full device timeline is in the gpemu trace (`gpemu run --trace`).
"""

from __future__ import annotations

import bisect
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
import torch.profiler.profiler as profiler_mod
from torch.autograd import DeviceType, ProfilerActivity
from torch.autograd.profiler_util import FunctionEvent

from gpemu.device.timeline import Work

_notice_shown = False


def _notice() -> None:
    global _notice_shown
    if not _notice_shown:
        _notice_shown = True
        print("gpemu: torch.profiler's CUDA events are the emulated GPU's kernels and copies (predicted times, one "
              "per launch); the full device timeline is in `gpemu run --trace`", file=sys.stderr)


def _without_cuda(activities: set[Any]) -> set[Any]:
    """Return `activities` without CUDA (CPU when nothing else is left), noting the drop once."""
    if ProfilerActivity.CUDA not in activities:
        return activities
    _notice()
    return (activities - {ProfilerActivity.CUDA}) or {ProfilerActivity.CPU}


def _patched_parse(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _parse_activities(activities: Any) -> tuple[set[Any], dict[Any, set[str]]]:
        parsed, filters = orig(activities)
        filters = {k: v for k, v in filters.items() if k != ProfilerActivity.CUDA}
        return _without_cuda(parsed), filters

    return _parse_activities


def _patched_supported(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def supported_activities() -> set[Any]:
        return set(orig()) - {ProfilerActivity.CUDA}

    return supported_activities


# Note [Emulated kernels in torch.profiler]
# Kineto cannot see the emulated GPU (a driverless build asked for CUDA activity prints a C++ stack trace per op), so
# it records host activity only. Before session 8 that was all a script got: `key_averages().table(sort_by=
# "cuda_time_total")` printed no CUDA column and `evt.device_time_total` read 0 for every op (pytorch/tutorials
# profiler_recipe.py, scaled_dot_product_attention_tutorial.py). Now a profiler asked for CUDA (explicitly, or by
# default through `supported_activities()`) keeps `use_device="cuda"` and, while it records, listens to every
# emulated device: each work item placed on an engine (kernel or copy, with its predicted GPU start and end) is
# kept with its host launch time. When kineto's results are parsed, each becomes what torch builds from CUPTI
# records: a CUDA FunctionEvent named after the work item, timed on the GPU, and a kernel appended to the innermost
# host op whose span holds its launch (so `self_device_time_total` / `device_time_total` of `aten::addmm` and of
# its parents are the emulated kernel times). Kineto's event times are Unix-epoch nanoseconds; gpemu's are
# `time.perf_counter()` seconds, mapped with one offset taken when recording starts. `export_chrome_trace` writes
# kineto's own trace, which has no device track: use `gpemu run --trace` for that.
_MAX_BACKTRACK = 256  # host events scanned back from a launch for the innermost one that holds it


class _WorkLog:
    """The emulated work launched while one profiler records, with the clock offset to kineto's epoch time."""

    def __init__(self) -> None:
        from gpemu.torch_backend import state

        self.works: list[Work] = []
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        emu = state.current_emulation()
        devices = emu.devices if emu is not None else []
        self._removers = [dev.add_listener(self) for dev in devices]

    def on_work(self, work: Work) -> None:
        """Keep one work item (DeviceListener)."""
        self.works.append(work)

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        """Ignore host waits (DeviceListener)."""

    def close(self) -> None:
        """Stop listening."""
        for remove in self._removers:
            remove()
        self._removers = []

    def rel_us(self, t_s: float, trace_start_ns: int) -> float:
        """Return perf_counter time `t_s` in microseconds after kineto's trace start."""
        return (t_s * 1e9 + self.epoch_offset_ns - trace_start_ns) / 1e3


def add_emulated_events(events: list[Any], log: _WorkLog, trace_start_ns: int, use_device: str) -> list[Any]:
    """Return kineto's parsed `events` plus a CUDA event per emulated work item in `log`, each also appended as a
    kernel to the innermost host op whose span holds its launch (Note [Emulated kernels in torch.profiler])."""
    if not log.works:
        return events
    # torch's "PythonSubclass" span (our __torch_dispatch__) sits inside the aten op: the op gets the kernel
    host = sorted((e for e in events if e.device_type == DeviceType.CPU and not e.is_async
                   and e.time_range.end > e.time_range.start and e.name != "PythonSubclass"),
                  key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in host]
    next_id = max((e.id for e in events), default=0) + 1
    added = []
    for work in log.works:
        launch_us = log.rel_us(work.launch_s, trace_start_ns)
        duration_us = max(0.0, work.end_s - work.start_s) * 1e6
        i = bisect.bisect_right(starts, launch_us) - 1
        for j in range(i, max(-1, i - _MAX_BACKTRACK), -1):
            if host[j].time_range.end >= launch_us:
                host[j].append_kernel(work.name, work.device_index, duration_us)
                break
        start_us = log.rel_us(work.start_s, trace_start_ns)
        added.append(FunctionEvent(id=next_id, name=work.name, thread=0, start_us=start_us,
                                   end_us=start_us + duration_us, use_device=use_device,
                                   device_type=DeviceType.CUDA, device_index=work.device_index,
                                   trace_name=work.name, stack=[], input_shapes=[]))
        next_id += 1
    out = list(events) + added
    out.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    return out


def _cuda_requested(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    activities = kwargs.get("activities", args[0] if args else None)
    if activities is None:
        return True  # torch.profiler's default: every supported activity, CUDA on a GPU
    return any(a == ProfilerActivity.CUDA or (isinstance(a, dict) and ProfilerActivity.CUDA in a)
               for a in activities)


def _patched_kineto_profile_init(orig: Callable[..., Any], drop_cuda: bool = False) -> Callable[..., Any]:
    """Return _KinetoProfile.__init__ that keeps `use_device="cuda"` when CUDA was asked for; with `drop_cuda`
    (torch < 2.12, no `_parse_activities` to patch) it also takes CUDA out of `self.activities` itself."""

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if _cuda_requested(args, kwargs):
            if drop_cuda:  # Note [Older torch releases] in emulation.py
                self.activities = _without_cuda(set(self.activities))
            self.use_device = "cuda"  # passed on to torch.autograd.profiler.profile (below)

    return __init__


def _patched_legacy_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, use_device: Any = None, **kwargs: Any) -> None:
        emulated = use_device == "cuda" or bool(kwargs.pop("use_cuda", False))
        if emulated:
            _notice()
        orig(self, *args, use_device=None if emulated else use_device, **kwargs)
        if emulated:  # kineto records the host only; the device events come from gpemu
            self.use_device = "cuda"
            self._gpemu_cuda = True

    return __init__


def _patched_start_trace(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _start_trace(self: Any) -> None:
        orig(self)
        if getattr(self, "_gpemu_cuda", False):
            self._gpemu_log = _WorkLog()

    return _start_trace


def _patched_exit(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __exit__(self: Any, *exc: Any) -> Any:
        try:
            return orig(self, *exc)
        finally:
            log = getattr(self, "_gpemu_log", None)
            if log is not None:
                log.close()

    return __exit__


def _patched_parse_kineto(orig_parse: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig_parse)
    def _parse_kineto_results(self: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        events = orig_parse(self, result, *args, **kwargs)
        log = getattr(self, "_gpemu_log", None)
        if log is None:
            return events
        self._gpemu_log = None  # parsed once per recording (acc_events keeps the parsed events)
        return add_emulated_events(events, log, result.trace_start_ns(), self.use_device)

    return _parse_kineto_results


def _patched_memory_timeline(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def export_memory_timeline(self: Any, path: str, device: str | None = None) -> None:
        if device is not None and torch.device(device).type != "cuda":
            return orig(self, path, device)
        print(f"gpemu: torch.profiler's export_memory_timeline({path!r}) has no emulated-GPU allocation events and "
              "writes nothing; the emulated memory is the 'memory (MiB)' counter track of `gpemu run --trace`, and "
              "torch.cuda.max_memory_allocated()/memory_snapshot() work", file=sys.stderr)
        return None

    return export_memory_timeline


def apply(patcher: Any) -> None:
    """Make torch.profiler / torch.autograd.profiler record host activity with kineto and the emulated GPU's work
    from gpemu while gpemu is installed (Note [Emulated kernels in torch.profiler])."""
    # torch >= 2.12 parses `activities` (which may hold {activity: [names]} filters) in _parse_activities; older
    # releases take `set(activities)` inside _KinetoProfile.__init__ (Note [Older torch releases] in emulation.py)
    parse = getattr(profiler_mod, "_parse_activities", None)
    if parse is not None:
        patcher.set(profiler_mod, "_parse_activities", _patched_parse(parse))
    patcher.set(profiler_mod, "supported_activities", _patched_supported(profiler_mod.supported_activities))
    patcher.set(torch.profiler, "supported_activities", profiler_mod.supported_activities)
    patcher.set(autograd_profiler.profile, "__init__", _patched_legacy_init(autograd_profiler.profile.__init__))
    kineto_profile = profiler_mod._KinetoProfile
    patcher.set(kineto_profile, "__init__", _patched_kineto_profile_init(kineto_profile.__init__, parse is None))
    patcher.set(kineto_profile, "export_memory_timeline",
                _patched_memory_timeline(kineto_profile.export_memory_timeline))
    legacy = autograd_profiler.profile
    patcher.set(legacy, "_start_trace", _patched_start_trace(legacy._start_trace))
    patcher.set(legacy, "__exit__", _patched_exit(legacy.__exit__))
    patcher.set(legacy, "_parse_kineto_results", _patched_parse_kineto(legacy._parse_kineto_results))
