"""Device-memory allocator model: PyTorch's CUDA caching allocator (blocks, segments, pools, stats, OOM).

See Note [Caching allocator model] for what is modelled and what is not.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIB = 1024**2
GIB = 1024**3

# Constants of c10/cuda/CUDACachingAllocator.cpp (PyTorch 1.x-2.x, unchanged since 2019).
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE_BYTES = MIB  # kSmallSize: requests <= this go to the small pool
SMALL_BUFFER_BYTES = 2 * MIB  # kSmallBuffer: small-pool segment size
LARGE_BUFFER_BYTES = 20 * MIB  # kLargeBuffer: segment for large requests below kMinLargeAlloc
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * MIB  # kRoundLarge: larger requests get a segment rounded up to this

# Note [Caching allocator model]
# Modelled as in CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc/free):
# - round_size: max(512, ceil(size/512)*512).
# - pools: requests <= 1 MiB use the small pool, others the large pool; each pool is kept per stream.
# - get_free_block: best fit = the smallest cached free block of the same pool and stream with size >= request.
# - a new segment (cudaMalloc) is 2 MiB (small), 20 MiB (1 MiB < request < 10 MiB) or the request rounded up to
#   2 MiB; it fails when context + everything reserved (by all allocators sharing the card) + the segment would
#   exceed capacity.
# - split: the remainder of a block becomes a free block when >= 512 B (small pool) or > 1 MiB (large pool);
#   otherwise the whole block is handed out and counts as allocated (so memory_allocated can exceed the sum of
#   rounded requests, as on hardware).
# - free: a block merges with free neighbours of its segment and goes back to its pool.
# - on a failed cudaMalloc: release every fully-free cached segment (release_cached_blocks), count one
#   num_alloc_retries, try again; if that fails, count num_ooms and raise OutOfMemoryError with CUDA's message.
# - empty_cache releases every fully-free segment.
# Not modelled: max_split_size_mb / roundup_power2_divisions / expandable_segments (PYTORCH_CUDA_ALLOC_CONF),
# record_stream (cross-stream use delays reuse), CUDA graphs private pools, physical fragmentation of the card.


class EmulatedOutOfMemoryError(torch.cuda.OutOfMemoryError):
    """Raised when the emulated card would run out of memory (same type scripts catch on real hardware)."""


class Block:
    """A contiguous range of one segment: allocated (handed to a tensor) or cached free."""

    __slots__ = ("addr", "allocated", "handle", "next", "pool_key", "prev", "requested_bytes", "segment", "size_bytes",
                 "stream_id", "tag")

    def __init__(self, addr: int, size_bytes: int, segment: Segment, stream_id: int, pool_key: tuple[bool, int]) -> None:
        self.addr = addr
        self.size_bytes = size_bytes
        self.segment = segment
        self.stream_id = stream_id
        self.pool_key = pool_key
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested_bytes = 0
        self.handle = 0
        self.tag = ""


@dataclass(eq=False)
class Segment:
    """One cudaMalloc'd range owned by the allocator."""

    addr: int
    size_bytes: int
    stream_id: int
    small: bool
    head: Block | None = None

    def is_free(self) -> bool:
        """Return True when the segment is one free block (it can be released to the driver)."""
        head = self.head
        return head is not None and head.next is None and not head.allocated


@dataclass(frozen=True)
class LiveBlock:
    """One live allocation as reported by snapshot()."""

    handle: int
    size_bytes: int
    requested_bytes: int
    stream_id: int
    tag: str
    segment_addr: int
    small_pool: bool


# "active" and "active_bytes" equal "allocation" and "allocated_bytes" here (no record_stream): reported as aliases.
_STAT_NAMES = (
    "allocation",
    "segment",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_ALIASES = {"active": "allocation", "active_bytes": "allocated_bytes"}
_POOLS = ("all", "small_pool", "large_pool")


class _Stat:
    """current/peak/allocated/freed for the all, small_pool and large_pool views (torch's Stat array)."""

    __slots__ = ("allocated", "current", "freed", "peak")

    def __init__(self) -> None:
        self.current = [0, 0, 0]
        self.peak = [0, 0, 0]
        self.allocated = [0, 0, 0]
        self.freed = [0, 0, 0]

    def add(self, pool: int, amount: int) -> None:
        cur = self.current
        c0 = cur[0] + amount
        c = cur[pool] + amount
        cur[0] = c0
        cur[pool] = c
        if amount > 0:
            allocated = self.allocated
            allocated[0] += amount
            allocated[pool] += amount
            peak = self.peak
            if c0 > peak[0]:
                peak[0] = c0
            if c > peak[pool]:
                peak[pool] = c
        else:
            freed = self.freed
            freed[0] -= amount
            freed[pool] -= amount

    def reset_peak(self) -> None:
        self.peak = list(self.current)

    def reset_accumulated(self) -> None:
        self.allocated = [0, 0, 0]
        self.freed = [0, 0, 0]


def round_size(size_bytes: int) -> int:
    """Return the request rounded as CUDACachingAllocator's round_size does (512 B multiples, at least 512)."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(rounded_bytes: int) -> int:
    """Return the size of the segment cudaMalloc'd for a request that finds no cached block."""
    if rounded_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def format_size(size_bytes: float) -> str:
    """Return a size formatted like c10's format_size ("512 bytes", "1.50 KiB", "20.00 MiB", "1.25 GiB")."""
    if size_bytes <= 1024:
        return f"{int(size_bytes)} bytes"
    if size_bytes <= MIB:
        return f"{size_bytes / 1024:.2f} KiB"
    if size_bytes <= GIB:
        return f"{size_bytes / MIB:.2f} MiB"
    return f"{size_bytes / GIB:.2f} GiB"


class DeviceMemory:
    """Physical memory of one card, shared by every allocator (process) using it."""

    def __init__(self, capacity_bytes: int, context_bytes: int = 0) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0  # CUDA contexts + all segments of all allocators on this card
        self.contexts_bytes = 0
        self.add_context(context_bytes)

    def add_context(self, context_bytes: int) -> None:
        """Charge one more CUDA context (one more process on the card)."""
        self.contexts_bytes += context_bytes
        self.used_bytes += context_bytes

    def free_bytes(self) -> int:
        """Return what cudaMemGetInfo would report as free."""
        return max(0, self.capacity_bytes - self.used_bytes)


OnChange = Callable[[int, int], None]  # (memory_allocated, memory_reserved) after a change


class CachingAllocator:
    """Model of PyTorch's CUDA caching allocator on one emulated device; answers torch.cuda's memory API."""

    ROUND_BYTES = MIN_BLOCK_BYTES

    def __init__(
        self,
        capacity_bytes: int,
        context_bytes: int = 0,
        device_index: int = 0,
        device_memory: DeviceMemory | None = None,
        on_change: OnChange | None = None,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.context_bytes = context_bytes
        self.device_index = device_index
        if device_memory is None:
            device_memory = DeviceMemory(capacity_bytes, context_bytes)
        else:
            device_memory.add_context(context_bytes)
        self.device_memory = device_memory
        self.on_change = on_change
        self._handles = itertools.count(1)
        self._addrs = itertools.count(1)
        self._live: dict[int, Block] = {}
        # pool key (small, stream_id) -> sorted list of (size_bytes, addr, block) of cached free blocks
        self._free: dict[tuple[bool, int], list[tuple[int, int, Block]]] = {}
        self._segments: dict[int, Segment] = {}
        self._stats = {name: _Stat() for name in _STAT_NAMES}
        self._alloc_bytes = self._stats["allocated_bytes"]
        self._req_bytes = self._stats["requested_bytes"]
        self._n_alloc = self._stats["allocation"]
        self._n_split = self._stats["inactive_split"]
        self._split_bytes = self._stats["inactive_split_bytes"]
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self._workspaces: dict[tuple[str, int], int] = {}

    # ---- allocation -------------------------------------------------------------------------------------------
    def malloc(self, size_bytes: int, stream_id: int = 0, tag: str = "") -> int:
        """Allocate `size_bytes` and return a handle; raise EmulatedOutOfMemoryError when it would not fit."""
        if size_bytes == 0:
            return 0  # torch hands out a null pointer for empty tensors and counts nothing
        size = MIN_BLOCK_BYTES if size_bytes < MIN_BLOCK_BYTES else -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        small = size <= SMALL_SIZE_BYTES
        key = (small, stream_id)
        pool = 1 if small else 2
        free = self._free.get(key)
        block: Block | None = None
        if free:
            i = bisect_left(free, (size,))
            if i < len(free):
                block = free.pop(i)[2]
                if block.prev is not None or block.next is not None:  # it was an inactive split block
                    self._n_split.add(pool, -1)
                    self._split_bytes.add(pool, -block.size_bytes)
        if block is None:
            block = self._new_segment(size, small, stream_id, key)
        remaining = block.size_bytes - size
        if (small and remaining >= MIN_BLOCK_BYTES) or (not small and remaining > SMALL_SIZE_BYTES):
            rest = Block(block.addr + size, remaining, block.segment, stream_id, key)
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size_bytes = size
            insort(self._free.setdefault(key, []), (remaining, rest.addr, rest))
            self._n_split.add(pool, 1)
            self._split_bytes.add(pool, remaining)
        block.allocated = True
        block.requested_bytes = size_bytes
        block.tag = tag
        handle = next(self._handles)
        block.handle = handle
        self._live[handle] = block
        bsize = block.size_bytes
        self._alloc_bytes.add(pool, bsize)
        self._req_bytes.add(pool, size_bytes)
        self._n_alloc.add(pool, 1)
        if self.on_change is not None:
            self.on_change(self._alloc_bytes.current[0], self._stats["reserved_bytes"].current[0])
        return handle

    def _new_segment(self, size: int, small: bool, stream_id: int, key: tuple[bool, int]) -> Block:
        seg_bytes = segment_size(size)
        if not self._device_alloc(seg_bytes):
            # release_cached_blocks() then retry (CUDACachingAllocator: alloc_block(..., isRetry=true))
            self._release_cached_segments()
            self.num_alloc_retries += 1
            if not self._device_alloc(seg_bytes):
                self.num_ooms += 1
                raise EmulatedOutOfMemoryError(self._oom_message(size))
        addr = next(self._addrs) << 40
        segment = Segment(addr, seg_bytes, stream_id, small)
        block = Block(addr, seg_bytes, segment, stream_id, key)
        segment.head = block
        self._segments[addr] = segment
        pool = 1 if small else 2
        self._stats["reserved_bytes"].add(pool, seg_bytes)
        self._stats["segment"].add(pool, 1)
        return block

    def _device_alloc(self, seg_bytes: int) -> bool:
        mem = self.device_memory
        if mem.used_bytes + seg_bytes > mem.capacity_bytes:
            return False
        mem.used_bytes += seg_bytes
        self.num_device_alloc += 1
        return True

    def free(self, handle: int) -> None:
        """Release an allocation back to the cache (idempotent)."""
        block = self._live.pop(handle, None)
        if block is None:
            return
        small = block.segment.small
        pool = 1 if small else 2
        bsize = block.size_bytes
        self._alloc_bytes.add(pool, -bsize)
        self._req_bytes.add(pool, -block.requested_bytes)
        self._n_alloc.add(pool, -1)
        block.allocated = False
        block.tag = ""
        free = self._free.setdefault(block.pool_key, [])
        inactive = self._n_split
        inactive_bytes = self._split_bytes
        for nb in (block.prev, block.next):
            if nb is not None and not nb.allocated:
                del free[bisect_left(free, (nb.size_bytes, nb.addr))]
                inactive.add(pool, -1)
                inactive_bytes.add(pool, -nb.size_bytes)
                if nb is block.prev:
                    block.addr = nb.addr
                    block.prev = nb.prev
                    if nb.prev is not None:
                        nb.prev.next = block
                    else:
                        block.segment.head = block
                else:
                    block.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = block
                block.size_bytes += nb.size_bytes
        insort(free, (block.size_bytes, block.addr, block))
        if block.prev is not None or block.next is not None:
            inactive.add(pool, 1)
            inactive_bytes.add(pool, block.size_bytes)
        if self.on_change is not None:
            self.on_change(self._alloc_bytes.current[0], self._stats["reserved_bytes"].current[0])

    def _release_cached_segments(self) -> None:
        for addr, segment in list(self._segments.items()):
            if not segment.is_free():
                continue
            head = segment.head
            assert head is not None
            free = self._free[head.pool_key]
            del free[bisect_left(free, (head.size_bytes, head.addr))]
            del self._segments[addr]
            pool = 1 if segment.small else 2
            self._stats["reserved_bytes"].add(pool, -segment.size_bytes)
            self._stats["segment"].add(pool, -1)
            self.device_memory.used_bytes -= segment.size_bytes
            self.num_device_free += 1

    def ensure_workspace(self, kind: str, stream_id: int, size_bytes: int) -> int:
        """Allocate a library workspace once per (kind, stream) and keep it live; return its handle.

        See Note [Library workspaces] in gpemu.memory.workspaces.
        """
        key = (kind, stream_id)
        handle = self._workspaces.get(key)
        if handle is None:
            handle = self.malloc(size_bytes, stream_id, tag=f"{kind} workspace")
            self._workspaces[key] = handle
        return handle

    # ---- errors -----------------------------------------------------------------------------------------------
    def _oom_message(self, rounded: int) -> str:
        mem = self.device_memory
        allocated = self._alloc_bytes.current[0]
        reserved = self._stats["reserved_bytes"].current[0]
        return (
            f"CUDA out of memory. Tried to allocate {format_size(rounded)}. GPU {self.device_index} has a total "
            f"capacity of {format_size(mem.capacity_bytes)} of which {format_size(mem.free_bytes())} is free. "
            f"Including non-PyTorch memory, this process has {format_size(self.context_bytes + reserved)} memory in "
            f"use. Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
            f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables) (emulated by gpemu)"
        )

    # ---- torch.cuda memory API --------------------------------------------------------------------------------
    def memory_allocated(self) -> int:
        """Return bytes currently allocated to tensors."""
        return self._alloc_bytes.current[0]

    def max_memory_allocated(self) -> int:
        """Return the peak of memory_allocated since the last reset."""
        return self._alloc_bytes.peak[0]

    def memory_reserved(self) -> int:
        """Return bytes held by the caching allocator."""
        return self._stats["reserved_bytes"].current[0]

    def max_memory_reserved(self) -> int:
        """Return the peak of memory_reserved since the last reset."""
        return self._stats["reserved_bytes"].peak[0]

    def reset_peak_memory_stats(self) -> None:
        """Reset every peak to its current value."""
        for stat in self._stats.values():
            stat.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        """Reset the cumulative allocated/freed counters and the retry/OOM counts."""
        for stat in self._stats.values():
            stat.reset_accumulated()
        self.num_alloc_retries = self.num_ooms = self.num_device_alloc = self.num_device_free = 0

    def empty_cache(self) -> None:
        """Release cached, unallocated segments to the (emulated) driver."""
        self._release_cached_segments()
        if self.on_change is not None:
            self.on_change(self.memory_allocated(), self.memory_reserved())

    def mem_get_info(self) -> tuple[int, int]:
        """Return (free, total) bytes as cudaMemGetInfo would, counting CUDA contexts."""
        return self.device_memory.free_bytes(), self.device_memory.capacity_bytes

    def memory_stats(self) -> dict[str, int]:
        """Return the counters torch.cuda.memory_stats() returns, under the same key names."""
        out: dict[str, int] = {}
        named = list(self._stats.items()) + [(alias, self._stats[name]) for alias, name in _ALIASES.items()]
        for name, stat in named:
            for i, pool in enumerate(_POOLS):
                out[f"{name}.{pool}.current"] = stat.current[i]
                out[f"{name}.{pool}.peak"] = stat.peak[i]
                out[f"{name}.{pool}.allocated"] = stat.allocated[i]
                out[f"{name}.{pool}.freed"] = stat.freed[i]
        for name in ("oversize_allocations", "oversize_segments"):
            for field_ in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{field_}"] = 0
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = 0
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["max_split_size"] = -1
        return dict(sorted(out.items()))

    def memory_summary(self, abbreviated: bool = False) -> str:
        """Return a table shaped like torch.cuda.memory_summary()."""
        stats = self.memory_stats()
        width = 75
        lines = [
            "|" + "=" * width + "|",
            "|" + f"  PyTorch CUDA memory summary, device ID {self.device_index:<4d}(emulated by gpemu)".ljust(width) + "|",
            "|" + "-" * width + "|",
            "|" + f"  CUDA OOMs: {stats['num_ooms']:<12d}|        cudaMalloc retries: {stats['num_alloc_retries']:<8d}".ljust(width) + "|",
            "|" + "=" * width + "|",
            "|" + "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".ljust(width) + "|",
        ]
        rows = (
            ("Allocated memory", "allocated_bytes", True),
            ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True),
            ("GPU reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True),
            ("Allocations", "allocation", False),
            ("Active allocs", "active", False),
            ("GPU reserved segments", "segment", False),
            ("Non-releasable allocs", "inactive_split", False),
        )
        for title, key, is_bytes in rows:
            lines.append("|" + "-" * width + "|")
            pools = ("all",) if abbreviated else _POOLS
            for pool in pools:
                label = {"all": title, "small_pool": "      from small pool", "large_pool": "      from large pool"}[pool]
                vals = [stats[f"{key}.{pool}.{f}"] for f in ("current", "peak", "allocated", "freed")]
                cells = [_fmt_cell(v, is_bytes) for v in vals]
                lines.append("|" + f" {label:<22}| {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} ".ljust(width) + "|")
        lines.append("|" + "=" * width + "|")
        return "\n".join(lines) + "\n"

    # ---- introspection ----------------------------------------------------------------------------------------
    def snapshot(self) -> list[LiveBlock]:
        """Return every live allocation (largest first)."""
        blocks = [
            LiveBlock(h, b.size_bytes, b.requested_bytes, b.stream_id, b.tag, b.segment.addr, b.segment.small)
            for h, b in self._live.items()
        ]
        return sorted(blocks, key=lambda b: -b.size_bytes)

    def allocated_by_tag(self) -> dict[str, int]:
        """Return live allocated bytes per tag, largest first."""
        out: dict[str, int] = {}
        for b in self._live.values():
            out[b.tag] = out.get(b.tag, 0) + b.size_bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def size_of(self, handle: int) -> int:
        """Return the bytes a live allocation holds (0 when unknown)."""
        block = self._live.get(handle)
        return block.size_bytes if block is not None else 0


def _fmt_cell(value: int, is_bytes: bool) -> str:
    if not is_bytes:
        return f"{value:>10d}"
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(value) >= scale * 10 or (unit == "KiB" and abs(value) >= 1024):
            return f"{value // scale:>6d} {unit}"
    return f"{value:>8d} B"
