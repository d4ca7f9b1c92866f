"""Device-memory allocator model: PyTorch's CUDA caching allocator (blocks, segments, pools, stats, OOM).

See Note [Caching allocator model] for what is modelled and what is not.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
# record_stream (cross-stream use delays reuse), physical fragmentation of the card. CUDA graphs' private pools
# are pools keyed by a negative id (Note [CUDA graphs] in graph.py), kept while a graph holds them (hold_pool).


class EmulatedOutOfMemoryError(torch.cuda.OutOfMemoryError):
    """Raised when the emulated card would run out of memory (same type scripts catch on real hardware)."""


class Block:
    """A contiguous range of one segment: allocated (handed to a tensor) or cached free."""

    __slots__ = ("addr", "allocated", "free_list", "handle", "next", "prev", "requested_bytes", "segment",
                 "size_bytes", "small", "stream_id", "tag")

    def __init__(self, addr: int, size_bytes: int, segment: Segment, free_list: list[tuple[int, int, Block]]) -> None:
        self.addr = addr
        self.size_bytes = size_bytes
        self.segment = segment
        self.stream_id = segment.stream_id
        self.small = segment.small
        self.free_list = free_list  # the sorted free list of this block's (pool, stream): where it goes when freed
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


@dataclass
class PeakWindow:
    """memory_allocated at the start and end of a peak_window() and its peak in between (bytes)."""

    start_bytes: int
    peak_bytes: int = 0
    end_bytes: int = 0


# torch stat name -> counter name in _Counters. "active" and "active_bytes" equal "allocation" and "allocated_bytes"
# here (no record_stream): reported as aliases.
_STAT_FIELDS = {
    "allocation": "n_alloc",
    "segment": "n_seg",
    "inactive_split": "n_split",
    "allocated_bytes": "alloc_bytes",
    "reserved_bytes": "res_bytes",
    "inactive_split_bytes": "split_bytes",
    "requested_bytes": "req_bytes",
}
_ALIASES = {"active": "allocation", "active_bytes": "allocated_bytes"}
_POOLS = ("all", "small_pool", "large_pool")

# Note [Allocator counters]
# malloc/free run for every tensor the emulator creates, so the torch Stat arrays (current/peak/allocated/freed for
# all, small_pool, large_pool) are kept as plain int slots updated inline, and memory_stats() is built from them on
# demand. For each stat X, every _Counters (one for all, one per pool) holds X (current) and X_peak; the pool ones
# also hold X_cum (torch's "allocated": sum of increases since reset_accumulated_memory_stats) and X_base (current
# at that reset). The rest is derived exactly: all.X_cum = small.X_cum + large.X_cum, and since
# current = base + allocated - freed, freed = X_base + X_cum - X. The "all" current is kept (not summed) because
# its peak is checked on every increase and memory_allocated() reads it.


class _Counters:
    """Current, peak, accumulated and reset-base values of every stat for one view (all, small or large pool)."""

    __slots__ = tuple(f"{n}{s}" for n in _STAT_FIELDS.values() for s in ("", "_peak", "_cum", "_base"))
    n_alloc: int
    n_alloc_peak: int
    n_alloc_cum: int
    n_alloc_base: int
    n_seg: int
    n_seg_peak: int
    n_seg_cum: int
    n_seg_base: int
    n_split: int
    n_split_peak: int
    n_split_cum: int
    n_split_base: int
    alloc_bytes: int
    alloc_bytes_peak: int
    alloc_bytes_cum: int
    alloc_bytes_base: int
    res_bytes: int
    res_bytes_peak: int
    res_bytes_cum: int
    res_bytes_base: int
    split_bytes: int
    split_bytes_peak: int
    split_bytes_cum: int
    split_bytes_base: int
    req_bytes: int
    req_bytes_peak: int
    req_bytes_cum: int
    req_bytes_base: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def reset_peak(self) -> None:
        for name in _STAT_FIELDS.values():
            setattr(self, name + "_peak", getattr(self, name))

    def reset_accumulated(self) -> None:
        for name in _STAT_FIELDS.values():
            setattr(self, name + "_cum", 0)
            setattr(self, name + "_base", getattr(self, name))


class _Cells:
    """Index 0/1/2 (all/small/large) of one counter, read (and written) live; see _AllocatedBytesView."""

    __slots__ = ("field", "views")

    def __init__(self, views: tuple[_Counters, _Counters, _Counters], field: str) -> None:
        self.views = views
        self.field = field

    def __getitem__(self, i: int) -> int:
        return int(getattr(self.views[i], self.field))

    def __setitem__(self, i: int, value: int) -> None:
        setattr(self.views[i], self.field, value)


class _AllocatedBytesView:
    """Compatibility view of the allocated_bytes stat as the old Stat object (.current[i], .peak[i] read/write).

    Prefer begin_peak_window()/end_peak_window(); this stays for callers that poke `allocator._alloc_bytes`.
    """

    def __init__(self, views: tuple[_Counters, _Counters, _Counters]) -> None:
        self.current = _Cells(views, "alloc_bytes")
        self.peak = _Cells(views, "alloc_bytes_peak")


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
        # stream_id -> sorted list of (size_bytes, addr, block) of cached free blocks, one dict per pool
        self._free_small: dict[int, list[tuple[int, int, Block]]] = {}
        self._free_large: dict[int, list[tuple[int, int, Block]]] = {}
        self._segments: dict[int, Segment] = {}
        self._spare: list[Block] = []  # Blocks merged away by free(), reused by malloc's splits
        self._all = _Counters()  # See Note [Allocator counters]
        self._small = _Counters()
        self._large = _Counters()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self._workspaces: dict[tuple[str, int], int] = {}
        self.workspace_bytes = 0  # block bytes of the live library workspaces (ensure_workspace)
        self._held_pools: dict[int, int] = {}  # private graph pool id -> live graphs using it (Note [CUDA graphs])

    @property
    def _alloc_bytes(self) -> _AllocatedBytesView:
        """Return the allocated_bytes stat as the old Stat object (.current[0], .peak[0]); kept for old callers."""
        return _AllocatedBytesView((self._all, self._small, self._large))

    # ---- allocation -------------------------------------------------------------------------------------------
    # malloc and free are the emulator's hottest host code (one call per tensor): counters are updated inline.
    # See Note [Allocator counters].
    def malloc(self, size_bytes: int, stream_id: int = 0, tag: str = "") -> int:
        """Allocate `size_bytes` and return a handle; raise EmulatedOutOfMemoryError when it would not fit."""
        if size_bytes == 0:
            return 0  # torch hands out a null pointer for empty tensors and counts nothing
        size = (size_bytes + 511) & -512 if size_bytes > MIN_BLOCK_BYTES else MIN_BLOCK_BYTES  # round_size
        small = size <= SMALL_SIZE_BYTES
        block = self._take_block(size, small, stream_id)
        pc = self._small if small else self._large
        ac = self._all
        block.allocated = True
        block.requested_bytes = size_bytes
        block.tag = tag
        handle = next(self._handles)
        block.handle = handle
        self._live[handle] = block
        bsize = block.size_bytes
        pc.alloc_bytes = c = pc.alloc_bytes + bsize
        if c > pc.alloc_bytes_peak:
            pc.alloc_bytes_peak = c
        pc.alloc_bytes_cum += bsize
        ac.alloc_bytes = allocated = ac.alloc_bytes + bsize
        if allocated > ac.alloc_bytes_peak:
            ac.alloc_bytes_peak = allocated
        pc.req_bytes = c = pc.req_bytes + size_bytes
        if c > pc.req_bytes_peak:
            pc.req_bytes_peak = c
        pc.req_bytes_cum += size_bytes
        ac.req_bytes = c = ac.req_bytes + size_bytes
        if c > ac.req_bytes_peak:
            ac.req_bytes_peak = c
        pc.n_alloc = c = pc.n_alloc + 1
        if c > pc.n_alloc_peak:
            pc.n_alloc_peak = c
        pc.n_alloc_cum += 1
        ac.n_alloc = c = ac.n_alloc + 1
        if c > ac.n_alloc_peak:
            ac.n_alloc_peak = c
        if self.on_change is not None:
            self.on_change(allocated, ac.res_bytes)
        return handle

    def malloc_many(self, sizes_bytes: list[int], stream_id: int = 0, tag: str = "") -> list[int]:
        """Return [malloc(s, stream_id, tag) for s in sizes_bytes], cheaper: same blocks, counters and peaks.

        Allocations only add, so every counter's peak over the sequence is its value at the end: the counters are
        updated once (the split counters, which go up and down, per block as in malloc). One on_change at the end.
        On an out-of-memory error the allocations made so far are freed again before it propagates.
        """
        handles: list[int] = []
        live = self._live
        next_handle = self._handles
        # per pool: [allocated bytes, requested bytes, allocations]
        small_sum = [0, 0, 0]
        large_sum = [0, 0, 0]
        try:
            for size_bytes in sizes_bytes:
                if size_bytes == 0:
                    handles.append(0)
                    continue
                size = (size_bytes + 511) & -512 if size_bytes > MIN_BLOCK_BYTES else MIN_BLOCK_BYTES
                small = size <= SMALL_SIZE_BYTES
                block = self._take_block(size, small, stream_id)
                block.allocated = True
                block.requested_bytes = size_bytes
                block.tag = tag
                handle = next(next_handle)
                block.handle = handle
                live[handle] = block
                handles.append(handle)
                acc = small_sum if small else large_sum
                acc[0] += block.size_bytes
                acc[1] += size_bytes
                acc[2] += 1
        finally:
            ac = self._all
            for pc, (bsize, req, n) in ((self._small, small_sum), (self._large, large_sum)):
                if not n:
                    continue
                for view in (pc, ac):
                    view.alloc_bytes = c = view.alloc_bytes + bsize
                    if c > view.alloc_bytes_peak:
                        view.alloc_bytes_peak = c
                    view.req_bytes = c = view.req_bytes + req
                    if c > view.req_bytes_peak:
                        view.req_bytes_peak = c
                    view.n_alloc = c = view.n_alloc + n
                    if c > view.n_alloc_peak:
                        view.n_alloc_peak = c
                pc.alloc_bytes_cum += bsize
                pc.req_bytes_cum += req
                pc.n_alloc_cum += n
            if len(handles) < len(sizes_bytes):  # out of memory part way: give back what was taken
                self.free_many(handles)
        if self.on_change is not None:
            self.on_change(ac.alloc_bytes, ac.res_bytes)
        return handles

    def _take_block(self, size: int, small: bool, stream_id: int) -> Block:
        """Return the block for a rounded request, split off a cached free block (best fit) or a new segment.

        """
        if small:
            pc = self._small
            free = self._free_small.get(stream_id)
        else:
            pc = self._large
            free = self._free_large.get(stream_id)
        ac = self._all
        block: Block | None = None
        if free:
            i = bisect_left(free, (size,))
            if i < len(free):
                block = free.pop(i)[2]
                if block.prev is not None or block.next is not None:  # it was an inactive split block
                    bsize = block.size_bytes
                    pc.n_split -= 1
                    ac.n_split -= 1
                    pc.split_bytes -= bsize
                    ac.split_bytes -= bsize
        if block is None:
            block = self._new_segment(size, small, stream_id)
        remaining = block.size_bytes - size
        if remaining >= MIN_BLOCK_BYTES if small else remaining > SMALL_SIZE_BYTES:
            free = block.free_list
            spare = self._spare
            if spare:  # recycle a Block merged away by free(): cheaper than a new object
                rest = spare.pop()
                rest.addr = block.addr + size
                rest.size_bytes = remaining
                rest.segment = block.segment
                rest.stream_id = block.stream_id
                rest.small = small
                rest.free_list = free
            else:
                rest = Block(block.addr + size, remaining, block.segment, free)
            rest.prev = block
            nxt = rest.next = block.next
            if nxt is not None:
                nxt.prev = rest
            block.next = rest
            block.size_bytes = size
            insort(free, (remaining, rest.addr, rest))
            _add_inactive_split(pc, ac, remaining)
        return block

    def _new_segment(self, size: int, small: bool, stream_id: int) -> Block:
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
        lists = self._free_small if small else self._free_large
        free = lists.get(stream_id)
        if free is None:
            free = lists[stream_id] = []
        block = Block(addr, seg_bytes, segment, free)
        segment.head = block
        self._segments[addr] = segment
        pc = self._small if small else self._large
        for view in (pc, self._all):
            view.res_bytes += seg_bytes
            view.res_bytes_peak = max(view.res_bytes_peak, view.res_bytes)
            view.n_seg += 1
            view.n_seg_peak = max(view.n_seg_peak, view.n_seg)
        pc.res_bytes_cum += seg_bytes
        pc.n_seg_cum += 1
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
        pc = self._small if block.small else self._large
        ac = self._all
        bsize = block.size_bytes
        pc.alloc_bytes -= bsize
        ac.alloc_bytes -= bsize
        req = block.requested_bytes
        pc.req_bytes -= req
        ac.req_bytes -= req
        pc.n_alloc -= 1
        ac.n_alloc -= 1
        self._return_block(block, pc, ac)
        if self.on_change is not None:
            self.on_change(ac.alloc_bytes, ac.res_bytes)

    def free_many(self, handles: list[int]) -> None:
        """Do free(h) for every handle, cheaper: the same blocks and counters, one on_change at the end."""
        live = self._live
        small, large, ac = self._small, self._large, self._all
        for handle in handles:
            block = live.pop(handle, None)
            if block is None:
                continue
            pc = small if block.small else large
            bsize = block.size_bytes
            req = block.requested_bytes
            pc.alloc_bytes -= bsize
            ac.alloc_bytes -= bsize
            pc.req_bytes -= req
            ac.req_bytes -= req
            pc.n_alloc -= 1
            ac.n_alloc -= 1
            self._return_block(block, pc, ac)
        if self.on_change is not None:
            self.on_change(ac.alloc_bytes, ac.res_bytes)

    def _return_block(self, block: Block, pc: _Counters, ac: _Counters) -> None:
        """Put a just-freed block back in its free list, merged with free neighbours (split counters updated)."""
        bsize = block.size_bytes
        block.allocated = False
        block.tag = ""
        free = block.free_list
        prev = block.prev
        if prev is not None and not prev.allocated:  # merge with the free block before
            nsize = prev.size_bytes
            del free[bisect_left(free, (nsize, prev.addr))]
            pc.n_split -= 1
            ac.n_split -= 1
            pc.split_bytes -= nsize
            ac.split_bytes -= nsize
            block.addr = prev.addr
            self._spare.append(prev)
            prev = block.prev = prev.prev
            if prev is not None:
                prev.next = block
            else:
                block.segment.head = block
            bsize += nsize
        nxt = block.next
        if nxt is not None and not nxt.allocated:  # merge with the free block after
            nsize = nxt.size_bytes
            del free[bisect_left(free, (nsize, nxt.addr))]
            pc.n_split -= 1
            ac.n_split -= 1
            pc.split_bytes -= nsize
            ac.split_bytes -= nsize
            self._spare.append(nxt)  # merged away: unlinked, free (allocated False, tag "")
            nxt = block.next = nxt.next
            if nxt is not None:
                nxt.prev = block
            bsize += nsize
        block.size_bytes = bsize
        insort(free, (bsize, block.addr, block))
        if prev is not None or nxt is not None:  # still part of a split segment: an inactive split block
            _add_inactive_split(pc, ac, bsize)

    def hold_pool(self, pool_id: int, graphs: int = 1) -> None:
        """Count `graphs` more (or, negative, fewer) live CUDA graphs using private pool `pool_id`: while any does, its
        cached segments are kept by empty_cache and the OOM retry, as torch keeps a live graph's pool."""
        held = self._held_pools.get(pool_id, 0) + graphs
        if held > 0:
            self._held_pools[pool_id] = held
        else:
            self._held_pools.pop(pool_id, None)

    def _release_cached_segments(self) -> None:
        held = self._held_pools
        for addr, segment in list(self._segments.items()):
            if not segment.is_free() or (held and segment.stream_id in held):
                continue
            head = segment.head
            assert head is not None
            free = head.free_list
            del free[bisect_left(free, (head.size_bytes, head.addr))]
            del self._segments[addr]
            pc = self._small if segment.small else self._large
            for view in (pc, self._all):
                view.res_bytes -= segment.size_bytes
                view.n_seg -= 1
            self.device_memory.used_bytes -= segment.size_bytes
            self.num_device_free += 1

    # ---- peak windows -----------------------------------------------------------------------------------------
    def begin_peak_window(self) -> int:
        """Start measuring the peak of memory_allocated from now; return the token end_peak_window needs.

        Windows may nest; reset_peak_memory_stats() inside a window also resets the window's peak.
        """
        token = self._all.alloc_bytes_peak
        self._all.alloc_bytes_peak = self._all.alloc_bytes
        return token

    def end_peak_window(self, token: int) -> int:
        """Return the peak of memory_allocated since begin_peak_window(); restore max_memory_allocated to the max of
        the peak before the window and the window's peak."""
        ac = self._all
        peak = ac.alloc_bytes_peak
        if token > peak:
            ac.alloc_bytes_peak = token
        return peak

    @contextmanager
    def peak_window(self) -> Iterator[PeakWindow]:
        """Return (as a context manager) a PeakWindow whose start/peak/end bytes are filled in on exit."""
        window = PeakWindow(self._all.alloc_bytes)
        token = self.begin_peak_window()
        try:
            yield window
        finally:
            window.end_bytes = self._all.alloc_bytes
            window.peak_bytes = self.end_peak_window(token)

    def ensure_workspace(self, kind: str, stream_id: int, size_bytes: int) -> int:
        """Allocate a library workspace once per (kind, stream) and keep it live; return its handle.

        See Note [Library workspaces] in gpemu.memory.workspaces.
        """
        key = (kind, stream_id)
        handle = self._workspaces.get(key)
        if handle is None:
            handle = self.malloc(size_bytes, stream_id, tag=f"{kind} workspace")
            self._workspaces[key] = handle
            self.workspace_bytes += self.size_of(handle)
        return handle

    # ---- errors -----------------------------------------------------------------------------------------------
    def _oom_message(self, rounded: int) -> str:
        mem = self.device_memory
        allocated = self._all.alloc_bytes
        reserved = self._all.res_bytes
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
        return self._all.alloc_bytes

    def max_memory_allocated(self) -> int:
        """Return the peak of memory_allocated since the last reset."""
        return self._all.alloc_bytes_peak

    def memory_reserved(self) -> int:
        """Return bytes held by the caching allocator."""
        return self._all.res_bytes

    def max_memory_reserved(self) -> int:
        """Return the peak of memory_reserved since the last reset."""
        return self._all.res_bytes_peak

    def reset_peak_memory_stats(self) -> None:
        """Reset every peak to its current value."""
        for view in (self._all, self._small, self._large):
            view.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        """Reset the cumulative allocated/freed counters and the retry/OOM counts."""
        for view in (self._all, self._small, self._large):
            view.reset_accumulated()
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
        named = list(_STAT_FIELDS.items()) + [(alias, _STAT_FIELDS[name]) for alias, name in _ALIASES.items()]
        views = (self._small, self._large)
        for name, field_ in named:
            current = [getattr(v, field_) for v in views]
            accumulated = [getattr(v, field_ + "_cum") for v in views]
            freed = [getattr(v, field_ + "_base") + a - c for v, a, c in zip(views, accumulated, current, strict=True)]
            peaks = [getattr(v, field_ + "_peak") for v in (self._all, *views)]
            for i, pool in enumerate(_POOLS):
                out[f"{name}.{pool}.current"] = getattr(self._all, field_) if i == 0 else current[i - 1]
                out[f"{name}.{pool}.peak"] = peaks[i]
                out[f"{name}.{pool}.allocated"] = sum(accumulated) if i == 0 else accumulated[i - 1]
                out[f"{name}.{pool}.freed"] = sum(freed) if i == 0 else freed[i - 1]
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

    def transient(self, size_bytes: int, stream_id: int = 0, tag: str = "") -> None:
        """Allocate `size_bytes` and free it at once, standing for temporaries that came and went as many tensors.

        A cached free block that fits is taken and given back (peaks and counters as malloc + free). When none fits
        but the cache holds that many free bytes in smaller blocks, only the allocated peak moves: the temporaries
        it stands for were served from those blocks when they ran one by one (Note [Saved activations as
        allocated] in gpemu.torch_backend.replay). Otherwise it is malloc + free: a new segment, or out of memory.
        """
        if size_bytes <= 0:
            return
        size = (size_bytes + 511) & -512 if size_bytes > MIN_BLOCK_BYTES else MIN_BLOCK_BYTES
        free = (self._free_small if size <= SMALL_SIZE_BYTES else self._free_large).get(stream_id)
        fits = bool(free) and bisect_left(free, (size,)) < len(free)  # type: ignore[arg-type]
        ac = self._all
        if not fits and ac.res_bytes - ac.alloc_bytes >= size:
            pc = self._small if size <= SMALL_SIZE_BYTES else self._large
            for view in (pc, ac):
                view.alloc_bytes_peak = max(view.alloc_bytes_peak, view.alloc_bytes + size)
                view.req_bytes_peak = max(view.req_bytes_peak, view.req_bytes + size_bytes)
            return
        self.free(self.malloc(size_bytes, stream_id, tag))

    def handle_mark(self) -> int:
        """Return a handle number no allocation gets: every allocation made later has a larger handle."""
        return next(self._handles)

    def live_since(self, mark: int) -> list[tuple[int, int, int]]:
        """Return (handle, requested bytes, block bytes) of every live allocation made after handle_mark() gave
        `mark`, in allocation order."""
        spaces = set(self._workspaces.values())  # library workspaces belong to no forward (Note [Library workspaces])
        return sorted((h, b.requested_bytes, b.size_bytes) for h, b in self._live.items() if h > mark
                      and h not in spaces)

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


def _add_inactive_split(pool: _Counters, all_: _Counters, size_bytes: int) -> None:
    """Count one more inactive split block of `size_bytes` in a pool's counters and in the 'all' counters."""
    pool.n_split = c = pool.n_split + 1
    if c > pool.n_split_peak:
        pool.n_split_peak = c
    pool.n_split_cum += 1
    all_.n_split = c = all_.n_split + 1
    if c > all_.n_split_peak:
        all_.n_split_peak = c
    pool.split_bytes = c = pool.split_bytes + size_bytes
    if c > pool.split_bytes_peak:
        pool.split_bytes_peak = c
    pool.split_bytes_cum += size_bytes
    all_.split_bytes = c = all_.split_bytes + size_bytes
    if c > all_.split_bytes_peak:
        all_.split_bytes_peak = c
