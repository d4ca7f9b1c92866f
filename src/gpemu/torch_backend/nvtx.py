"""torch.cuda.nvtx on a torch built without CUDA: ranges and marks are accepted, and nothing is recorded."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

# Note [NVTX without a CUDA build]: a CUDA build of torch has `torch._C._nvtx`, and its NVTX calls work on a host
# without a driver: NVTX records nothing until a profiler such as Nsight attaches. A CPU-only build (`torch==X+cpu`,
# what CPU machines usually install) has a stub in `torch.cuda.nvtx` that raises "NVTX functions not installed. Are
# you sure you have a CUDA build?", so a script that marks its steps with `torch.cuda.nvtx.range_push` / `range(...)`
# (timm's train.py, Megatron, NVIDIA's examples) died at the first step (found with torch 2.13.0+cpu). While an
# emulation is installed on such a build, these functions return what libnvToolsExt returns with no tool attached:
# push and pop return the per-thread nesting depth, and start returns a fresh range id. A CUDA build keeps torch's
# own functions.


class _EmulatedNVTX:
    """The functions of `torch._C._nvtx`, keeping only the per-thread nesting depth."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._ids = itertools.count(1)

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def rangePushA(self, msg: str) -> int:
        """Open a nested range; return its zero-based depth."""
        depth = self._depth()
        self._local.depth = depth + 1
        return depth

    def rangePop(self) -> int:
        """Close the innermost range; return its zero-based depth (-1 with no range open, as NVTX does)."""
        depth = self._depth() - 1
        if depth < 0:
            return -1
        self._local.depth = depth
        return depth

    def rangeStartA(self, msg: str) -> int:
        """Start a range that can end on any thread; return its id."""
        return next(self._ids)

    def rangeEnd(self, range_id: int) -> None:
        """End a range started by rangeStartA."""

    def markA(self, msg: str) -> None:
        """Mark an instant."""

    def deviceRangeStart(self, msg: str, stream: Any = 0) -> int:
        """Start a range on a device stream; return its handle."""
        return next(self._ids)

    def deviceRangeEnd(self, range_handle: Any, stream: Any = 0) -> None:
        """End a device range."""


def apply(patcher: Any) -> None:
    """Give torch.cuda.nvtx working no-op functions when this torch has no NVTX (Note [NVTX without a CUDA
    build]); a no-op on a CUDA build."""
    if hasattr(torch._C, "_nvtx"):
        return
    import torch.cuda.nvtx as nvtx_mod

    patcher.set(nvtx_mod, "_nvtx", _EmulatedNVTX())
