"""Tests for MemoryTracker: meta-tensor storages are charged once and freed when the last view dies."""

from __future__ import annotations

import torch

from gpemu.device.allocator import CachingAllocator
from gpemu.memory import MemoryTracker


def test_new_storages_are_charged_and_views_are_free() -> None:
    a = CachingAllocator(1 << 40)
    with MemoryTracker(a) as tracker:
        x = torch.empty(1000, device="meta")  # 4000 B -> 4096
        v = x.view(10, 100)
        y = x * 2  # a new 4096 B storage
        x.add_(1)  # in place: nothing new
        assert a.memory_allocated() == 8192  # 4096 + 4096
        del x
        assert a.memory_allocated() == 8192  # the view keeps the storage alive
        del v
        assert a.memory_allocated() == 4096
        del y
        assert a.memory_allocated() == 0
        assert tracker.live_bytes() == 0


def test_track_charges_outside_tensors_with_a_tag() -> None:
    a = CachingAllocator(1 << 40)
    tracker = MemoryTracker(a)
    w = torch.empty(256, 512, device="meta")
    tracker.track([w, w], tag="weights")  # charged once: 256 * 512 * 4 = 524288
    assert a.allocated_by_tag() == {"weights": 524288}


def test_cublas_workspace_once_per_thread() -> None:
    a = CachingAllocator(1 << 40)
    with MemoryTracker(a, cublas_workspace_bytes=8519680):
        w = torch.empty(4, 4, device="meta", requires_grad=True)
        x = torch.empty(8, 4, device="meta")
        out = (x @ w).sum()
        out.backward()  # the backward mm runs on the autograd thread's handle
        out2 = x @ w
    assert a.allocated_by_tag()["cublas (main thread) workspace"] == 8519680
    assert a.allocated_by_tag()["cublas (autograd thread) workspace"] == 8519680
    del out2
