"""Tests for the pinned host-memory pool: real copies, size classes, reuse across epochs, mlock fallback."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpemu.host import pinned
from gpemu.host.pinned import GpemuWarning, PinnedPool, size_class


def test_size_classes_are_powers_of_two() -> None:
    assert size_class(1) == 512
    assert size_class(513) == 1024
    assert size_class(3 * 224 * 224 * 4 * 64) == 64 * 1024**2  # 38535168 B -> 2**26


def test_pin_tensor_is_a_real_copy_in_a_pool_buffer() -> None:
    pool = PinnedPool(lock_pages=False)  # independent of this machine's RLIMIT_MEMLOCK
    x = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    y = pool.pin_tensor(x)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    assert pool.is_pinned(y) and pool.is_pinned(y[3]) and not pool.is_pinned(x)
    assert pool.pin_tensor(y) is y  # already pinned
    assert pool.pinned_bytes() == 4096  # 4000 B -> 4096 size class
    assert pool.stats()["copied_bytes"] == 4000


def test_second_epoch_allocates_no_new_pinned_memory() -> None:
    pool = PinnedPool(lock_pages=False)
    shapes = [(8, 3, 32, 32), (8,), (5, 3, 32, 32), (5,)]  # full batches, then a last partial batch

    def epoch() -> None:
        for _ in range(4):
            images, labels = (pool.pin_tensor(torch.ones(s)) for s in shapes[:2])
            del images, labels  # the training step consumed them
        last = [pool.pin_tensor(torch.ones(s)) for s in shapes[2:]]
        del last

    epoch()
    created, held = pool.buffers_created, pool.pinned_bytes()
    assert created == 3  # 8*3*32*32*4 = 98304 -> 131072; 8*4 = 32 and 5*4 = 20 -> 512 (one buffer reused); 61440 -> 65536
    epoch()
    assert pool.buffers_created == created
    assert pool.pinned_bytes() == held == 131072 + 512 + 65536
    assert pool.reuses == 2 * 10 - created  # every pin but the first of each class was a reuse


def test_mlock_failure_warns_once_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pinned, "_mlock", lambda addr, size: 12)  # ENOMEM, as over RLIMIT_MEMLOCK
    pool = PinnedPool()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = [pool.pin_tensor(torch.ones(1000 * (i + 1))) for i in range(3)]
    gpemu_warnings = [w for w in caught if issubclass(w.category, GpemuWarning)]
    assert len(gpemu_warnings) == 1
    assert "mlock" in str(gpemu_warnings[0].message)
    assert pool.locked_bytes() == 0 and pool.pinned_bytes() > 0
    assert all(pool.is_pinned(t) for t in kept)
