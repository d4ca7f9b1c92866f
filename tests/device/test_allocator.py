"""Tests for the CUDA caching-allocator model: rounding, pools, splitting, merging, caching, OOM, stats."""

from __future__ import annotations

import time

import pytest
import torch

from gpemu.device.allocator import MIB, CachingAllocator, DeviceMemory, EmulatedOutOfMemoryError, format_size

BIG = 1 << 40


def test_small_requests_round_to_512_and_share_a_2mib_segment() -> None:
    a = CachingAllocator(BIG)
    a.malloc(1)
    a.malloc(1000)
    # 512 + 1024 (1000 rounded up to 2 x 512) = 1536
    assert a.memory_allocated() == 1536
    assert a.memory_reserved() == 2 * MIB  # one small-pool segment (kSmallBuffer)
    assert a.memory_stats()["segment.small_pool.current"] == 1


def test_large_segment_sizes() -> None:
    a = CachingAllocator(BIG)
    a.malloc(3 * MIB)  # 1 MiB < 3 MiB < 10 MiB -> a 20 MiB segment (kLargeBuffer)
    assert a.memory_reserved() == 20 * MIB
    a.malloc(3 * MIB)  # served from the 17 MiB remainder of the same segment
    assert a.memory_reserved() == 20 * MIB
    a.malloc(21 * MIB + 1)  # >= 10 MiB -> rounded up to a 2 MiB multiple: 22 MiB
    assert a.memory_reserved() == 42 * MIB  # 20 + 22


def test_unsplit_remainder_counts_as_allocated() -> None:
    a = CachingAllocator(BIG)
    a.malloc(11 * MIB + MIB // 2)  # segment 12 MiB; remainder 0.5 MiB <= 1 MiB is not split off (large pool)
    assert a.memory_allocated() == 12 * MIB
    b = CachingAllocator(BIG)
    b.malloc(10 * MIB + MIB // 2)  # segment 12 MiB; remainder 1.5 MiB > 1 MiB is split off
    assert b.memory_allocated() == 10 * MIB + MIB // 2


def test_free_merges_neighbours_and_reuses_the_cache() -> None:
    a = CachingAllocator(BIG)
    h1, h2, h3 = (a.malloc(2 * MIB) for _ in range(3))  # three blocks in one 20 MiB segment
    a.free(h1)
    a.free(h2)  # merges with h1's block: one 4 MiB free block at the segment start
    assert a.memory_stats()["inactive_split.large_pool.current"] == 2  # merged 4 MiB block + the 14 MiB tail
    a.malloc(4 * MIB)  # fits the merged block exactly: no new segment
    assert a.memory_reserved() == 20 * MIB
    assert a.memory_allocated() == 6 * MIB  # 4 + h3's 2
    a.free(h3)


def test_best_fit_picks_the_smallest_block_that_fits() -> None:
    a = CachingAllocator(BIG)
    big = a.malloc(40 * MIB)
    small = a.malloc(12 * MIB)
    a.free(big)
    a.free(small)
    a.malloc(11 * MIB)  # both cached segments fit; best fit takes the 12 MiB one whole (remainder 1 MiB not split)
    assert a.memory_allocated() == 12 * MIB


def test_pools_are_per_stream() -> None:
    a = CachingAllocator(BIG)
    a.free(a.malloc(4 * MIB, stream_id=0))
    a.malloc(4 * MIB, stream_id=1)  # the cached block belongs to stream 0: a new segment
    assert a.memory_reserved() == 40 * MIB  # 2 x 20 MiB


def test_empty_cache_and_mem_get_info_count_the_context() -> None:
    a = CachingAllocator(1024 * MIB, context_bytes=300 * MIB)
    h = a.malloc(100 * MIB)
    assert a.mem_get_info() == ((1024 - 300 - 100) * MIB, 1024 * MIB)  # 624 MiB free
    a.free(h)
    assert a.memory_reserved() == 100 * MIB  # still cached
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert a.mem_get_info() == (724 * MIB, 1024 * MIB)  # 1024 - 300


def test_oom_frees_cached_blocks_and_retries_before_raising() -> None:
    a = CachingAllocator(100 * MIB, context_bytes=20 * MIB)
    a.free(a.malloc(60 * MIB))  # 60 MiB cached, 20 MiB free on the card
    h = a.malloc(70 * MIB)  # no cached block fits, cudaMalloc fails -> release the cache, retry: succeeds
    assert a.memory_stats()["num_alloc_retries"] == 1
    assert a.memory_reserved() == 70 * MIB
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        a.malloc(20 * MIB)  # 20 + 70 + 20 > 100
    assert isinstance(info.value, EmulatedOutOfMemoryError)
    msg = str(info.value)
    assert msg.startswith("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 100.00 MiB")
    assert "of which 10.00 MiB is free" in msg  # 100 - 20 - 70
    assert "70.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated" in msg
    assert a.memory_stats()["num_ooms"] == 1
    a.free(h)


def test_two_processes_share_one_card() -> None:
    card = DeviceMemory(1024 * MIB)
    p1 = CachingAllocator(1024 * MIB, 300 * MIB, device_memory=card)
    p2 = CachingAllocator(1024 * MIB, 300 * MIB, device_memory=card)
    p1.malloc(200 * MIB)
    assert p2.mem_get_info()[0] == 224 * MIB  # 1024 - 2 x 300 - 200
    with pytest.raises(EmulatedOutOfMemoryError):
        p2.malloc(300 * MIB)


def test_peaks_reset_and_stats_keys() -> None:
    a = CachingAllocator(BIG)
    h = a.malloc(5 * MIB)
    a.free(h)
    assert a.max_memory_allocated() == 5 * MIB
    a.reset_peak_memory_stats()
    assert a.max_memory_allocated() == 0
    assert a.max_memory_reserved() == 20 * MIB
    stats = a.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.large_pool.freed",
                "requested_bytes.all.allocated", "num_alloc_retries", "num_ooms"):
        assert key in stats
    assert stats["allocated_bytes.all.allocated"] == 5 * MIB
    assert stats["allocated_bytes.all.freed"] == 5 * MIB
    summary = a.memory_summary()
    assert "Allocated memory" in summary and "GPU reserved memory" in summary and "20 MiB" in summary


def test_on_change_snapshot_and_tags() -> None:
    seen: list[tuple[int, int]] = []
    a = CachingAllocator(BIG, on_change=lambda alloc, res: seen.append((alloc, res)))
    h = a.malloc(1000, tag="conv1")
    a.malloc(3000, tag="conv1")
    a.malloc(600, tag="fc")
    assert seen[0] == (1024, 2 * MIB)
    assert a.allocated_by_tag() == {"conv1": 1024 + 3072, "fc": 1024}
    assert a.snapshot()[0].tag == "conv1"  # largest first
    a.free(h)
    assert seen[-1] == (3072 + 1024, 2 * MIB)


def test_workspace_is_allocated_once_per_stream() -> None:
    a = CachingAllocator(BIG)
    h = a.ensure_workspace("cublas", 0, 8519680)
    assert a.ensure_workspace("cublas", 0, 8519680) == h
    a.ensure_workspace("cublas", 1, 8519680)
    assert a.memory_allocated() == 2 * 8519680  # 8519680 is a multiple of 512


def test_format_size() -> None:
    assert format_size(512) == "512 bytes"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(20 * MIB) == "20.00 MiB"
    assert format_size(3 * 1024**3) == "3.00 GiB"


def test_malloc_free_is_fast() -> None:
    a = CachingAllocator(BIG)
    sizes = [4096, 602112, 4 * MIB, 12845056, 512000] * 4000
    live: list[int] = []
    start = time.perf_counter()
    for i, size in enumerate(sizes):
        live.append(a.malloc(size))
        if len(live) > 200:
            a.free(live.pop((i * 7919) % len(live)))
    per_op_us = (time.perf_counter() - start) / (2 * len(sizes)) * 1e6
    assert per_op_us < 25  # ~1.5 us measured (was ~3 us before inline counters); generous for a loaded CI box


def test_peak_window_measures_inside_and_restores_the_global_peak() -> None:
    a = CachingAllocator(BIG)
    a.free(a.malloc(8 * MIB))  # global peak 8 MiB
    keep = a.malloc(MIB)  # 1 MiB live
    token = a.begin_peak_window()
    assert a.max_memory_allocated() == MIB  # the window starts at the current 1 MiB
    a.free(a.malloc(2 * MIB))
    assert a.end_peak_window(token) == 3 * MIB  # 1 + 2
    assert a.max_memory_allocated() == 8 * MIB  # max(8, 3)
    with a.peak_window() as win:
        h = a.malloc(10 * MIB)
        a.free(a.malloc(4 * MIB))
    # start 1 MiB; peak 1 + 10 + 4 = 15 MiB; end 1 + 10 = 11 MiB
    assert (win.start_bytes, win.peak_bytes, win.end_bytes) == (MIB, 15 * MIB, 11 * MIB)
    assert a.max_memory_allocated() == 15 * MIB  # max(8, 15)
    a.free(h)
    a.free(keep)


def test_accumulated_stats_after_reset() -> None:
    a = CachingAllocator(BIG)
    h1 = a.malloc(4096)
    h2 = a.malloc(3 * MIB)
    a.reset_accumulated_memory_stats()
    a.free(h1)
    a.malloc(1024)
    stats = a.memory_stats()
    assert stats["allocated_bytes.small_pool.allocated"] == 1024  # only the malloc after the reset
    assert stats["allocated_bytes.small_pool.freed"] == 4096
    assert stats["allocated_bytes.all.freed"] == 4096
    assert stats["allocation.all.current"] == 2  # h2 and the 1024 B block
    assert stats["allocation.large_pool.freed"] == 0
    assert stats["requested_bytes.all.current"] == 3 * MIB + 1024
    a.free(h2)
    assert a.memory_stats()["allocated_bytes.large_pool.freed"] == 3 * MIB


def _snapshot(a: CachingAllocator) -> tuple[object, ...]:
    blocks = [(b.size_bytes, b.requested_bytes, b.stream_id, b.tag, b.segment_addr, b.small_pool) for b in a.snapshot()]
    return a.memory_stats(), sorted(blocks)


@pytest.mark.parametrize(
    ("description", "sizes"),
    [
        ("small only, one segment", [1, 600, 4096, 0, 100_000]),
        ("large ones, unsplit remainders", [3 * MIB, int(2.5 * MIB), 700_000, 12 * MIB]),
        ("mixed, reusing cached blocks", [5 * MIB, 512, 9 * MIB, 2048, int(1.5 * MIB), 0, 1 << 20]),
    ],
)
def test_malloc_many_and_free_many_match_one_call_per_block(description: str, sizes: list[int]) -> None:
    def prepare(a: CachingAllocator) -> list[int]:
        # leave cached, split blocks of both pools behind, and a peak above the current level
        keep = [a.malloc(s) for s in (3000, 4 * MIB, 100)]
        for h in [a.malloc(s) for s in (9 * MIB, 8000, 2 * MIB)]:
            a.free(h)
        return keep

    one, many = CachingAllocator(BIG), CachingAllocator(BIG)
    prepare(one), prepare(many)
    changes: list[tuple[int, int]] = []
    many.on_change = lambda allocated, reserved: changes.append((allocated, reserved))
    handles_one = [one.malloc(s, 0, "g") for s in sizes]
    handles_many = many.malloc_many(sizes, 0, "g")
    assert [h == 0 for h in handles_many] == [s == 0 for s in sizes], description  # empty: no allocation
    assert _snapshot(many) == _snapshot(one), description  # same blocks, counters and peaks
    assert changes == [(many.memory_allocated(), many.memory_reserved())]  # one on_change for the batch
    for h in handles_one:
        one.free(h)
    many.free_many(handles_many)
    assert _snapshot(many) == _snapshot(one), description
    assert many.max_memory_allocated() == one.max_memory_allocated() > many.memory_allocated()


def test_malloc_many_out_of_memory_frees_what_it_took() -> None:
    a = CachingAllocator(64 * MIB)
    before = a.memory_stats()["allocated_bytes.all.current"]
    with pytest.raises(EmulatedOutOfMemoryError):
        a.malloc_many([20 * MIB, 20 * MIB, 40 * MIB])  # 20 + 20 fit in 64 MiB, the third 40 does not
    assert a.memory_allocated() == before == 0
    assert a.memory_stats()["allocation.all.current"] == 0
    assert a.max_memory_allocated() == 40 * MIB  # the two that were made before the failure
