"""Per-op fast path: a repeated op (cache hit) returns what the meta kernel returned the first time (cache miss)."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import tensor as emu_tensor


def test_cache_hit_rebuilds_fresh_outputs_with_the_same_metadata(emu: gt.Emulation) -> None:
    x = torch.randn(2, 3, 8, 8, device="cuda").to(memory_format=torch.channels_last)
    assert x.stride() == (192, 1, 24, 3)  # channels_last: C=3, W*C=24, H*W*C=192
    w = torch.randn(4, 3, 3, 3, device="cuda")
    first = torch.nn.functional.conv2d(x, w, padding=1)
    hits_before = len(emu_tensor._op_cache)
    second = torch.nn.functional.conv2d(x, w, padding=1)
    assert len(emu_tensor._op_cache) == hits_before  # no new entry: the second call was a hit
    assert second.shape == first.shape == (2, 4, 8, 8)  # (8 + 2*1 - 3) // 1 + 1 = 8
    assert second.stride() == first.stride() == (256, 1, 32, 4)  # channels_last out: C=4, W*C=32, H*W*C=256
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata  # a fresh allocation each time


def test_cache_hit_keeps_in_place_and_multi_output_semantics(emu: gt.Emulation) -> None:
    x = torch.randn(16, 8, device="cuda")
    for _ in range(2):  # miss, then hit
        y = x.mul_(2.0)
        assert y is x
        values, indices = torch.topk(x, 3, dim=1)
        assert values.shape == indices.shape == (16, 3)
        assert values.dtype == torch.float32 and indices.dtype == torch.int64
    before = emu.devices[0].allocator.memory_allocated()
    out = x + 1
    # one new storage: 16 * 8 * 4 = 512 bytes (the allocator's 512-byte minimum block)
    assert emu.devices[0].allocator.memory_allocated() - before == 512
    del out
    assert emu.devices[0].allocator.memory_allocated() == before
