"""torch.profiler under emulation: CUDA activity is dropped (host activity is kept), with a one-line notice.

A driverless build asked for ProfilerActivity.CUDA falls back to recording CUDA events around every op and prints a
multi-line C++ stack trace per op ("Failed to record CUDA event"). Under gpemu the profiler records CPU activity
only; the emulated GPU's kernels, copies and memory are in the gpemu trace (`gpemu run --trace`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
import torch.profiler.profiler as profiler_mod
from torch.autograd import ProfilerActivity

_notice_shown = False


def _notice() -> None:
    global _notice_shown
    if not _notice_shown:
        _notice_shown = True
        print("gpemu: torch.profiler records host (CPU) activity only; the emulated GPU's kernels are in "
              "`gpemu run --trace`", file=sys.stderr)


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


def _patched_legacy_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, use_device: Any = None, **kwargs: Any) -> None:
        if use_device == "cuda" or kwargs.pop("use_cuda", False):
            _notice()
            use_device = None
        orig(self, *args, use_device=use_device, **kwargs)

    return __init__


def apply(patcher: Any) -> None:
    """Make torch.profiler / torch.autograd.profiler record host activity only while gpemu is installed."""
    patcher.set(profiler_mod, "_parse_activities", _patched_parse(profiler_mod._parse_activities))
    patcher.set(profiler_mod, "supported_activities", _patched_supported(profiler_mod.supported_activities))
    patcher.set(torch.profiler, "supported_activities", profiler_mod.supported_activities)
    patcher.set(autograd_profiler.profile, "__init__", _patched_legacy_init(autograd_profiler.profile.__init__))
