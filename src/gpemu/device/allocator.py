"""Device-memory allocator model (minimal seam: the memory issue replaces the internals, keeping this API)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

MIB = 1024**2


class EmulatedOutOfMemoryError(torch.cuda.OutOfMemoryError):
    """Raised when the emulated card would run out of memory (same type scripts catch on real hardware)."""


@dataclass
class Block:
    """One live allocation."""

    handle: int
    size_bytes: int  # rounded size
    requested_bytes: int
    stream_id: int
    tag: str


class CachingAllocator:
    """Tracks live allocations on one emulated device; answers torch.cuda's memory API."""

    ROUND_BYTES = 512

    def __init__(self, capacity_bytes: int, context_bytes: int = 0, device_index: int = 0) -> None:
        self.capacity_bytes = capacity_bytes
        self.context_bytes = context_bytes
        self.device_index = device_index
        self._handles = itertools.count(1)
        self._blocks: dict[int, Block] = {}
        self._allocated = 0
        self._peak_allocated = 0
        self._reserved = 0
        self._peak_reserved = 0

    def malloc(self, size_bytes: int, stream_id: int = 0, tag: str = "") -> int:
        """Allocate `size_bytes` and return a handle; raise EmulatedOutOfMemoryError when it would not fit."""
        rounded = max(self.ROUND_BYTES, -(-size_bytes // self.ROUND_BYTES) * self.ROUND_BYTES) if size_bytes else 0
        if self._allocated + rounded > self.capacity_bytes - self.context_bytes:
            raise EmulatedOutOfMemoryError(self._oom_message(rounded))
        handle = next(self._handles)
        self._blocks[handle] = Block(handle, rounded, size_bytes, stream_id, tag)
        self._allocated += rounded
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        self._reserved = max(self._reserved, self._allocated)
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return handle

    def free(self, handle: int) -> None:
        """Release an allocation (idempotent)."""
        block = self._blocks.pop(handle, None)
        if block is not None:
            self._allocated -= block.size_bytes

    def _oom_message(self, rounded: int) -> str:
        total = self.capacity_bytes
        free = max(0, total - self.context_bytes - self._reserved)
        return (
            f"CUDA out of memory. Tried to allocate {rounded / MIB:.2f} MiB. GPU {self.device_index} has a total "
            f"capacity of {total / 1024**3:.2f} GiB of which {free / MIB:.2f} MiB is free. Of the allocated memory "
            f"{self._allocated / 1024**3:.2f} GiB is allocated by PyTorch, and "
            f"{(self._reserved - self._allocated) / MIB:.2f} MiB is reserved by PyTorch but unallocated. (emulated by gpemu)"
        )

    def memory_allocated(self) -> int:
        """Return bytes currently allocated to tensors."""
        return self._allocated

    def max_memory_allocated(self) -> int:
        """Return the peak of memory_allocated since the last reset."""
        return self._peak_allocated

    def memory_reserved(self) -> int:
        """Return bytes held by the caching allocator."""
        return self._reserved

    def max_memory_reserved(self) -> int:
        """Return the peak of memory_reserved since the last reset."""
        return self._peak_reserved

    def reset_peak_memory_stats(self) -> None:
        """Reset both peaks to the current values."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved

    def empty_cache(self) -> None:
        """Release cached, unallocated memory."""
        self._reserved = self._allocated

    def mem_get_info(self) -> tuple[int, int]:
        """Return (free, total) bytes as cudaMemGetInfo would, counting the CUDA context."""
        return max(0, self.capacity_bytes - self.context_bytes - self._reserved), self.capacity_bytes
