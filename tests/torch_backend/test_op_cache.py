"""Per-op fast path: a repeated op (cache hit) returns what the meta kernel returned the first time (cache miss)."""

from __future__ import annotations

import pytest
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


def test_fused_and_foreach_optimizer_kernels_hit_the_cache_whatever_their_float_scalars() -> None:
    # Note [Float scalars of list ops]: a learning-rate schedule (fused AdamW's lr) and Adam's per-step bias
    # corrections (foreach Adam's list of step sizes) change float arguments every step, not what the kernels do
    gt.install("v100", replay=False)  # no optimizer replay: every step runs per op
    try:
        for kwargs in ({"fused": True}, {"foreach": True}):
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
            sizes = []
            for _ in range(4):
                model(torch.randn(4, 8, device="cuda")).sum().backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                sizes.append(len(emu_tensor._op_cache))
            assert sizes[2] == sizes[3], kwargs  # steps 3 and 4: only hits, though lr and step sizes changed
        add = torch.ops.aten.add.Tensor  # other ops keep exact float keys: alpha=2.0 and alpha=3.0 are two entries
        x = torch.zeros(3, device="cuda")
        before = len(emu_tensor._op_cache)
        add(x, x, alpha=2.0)
        add(x, x, alpha=3.0)
        assert len(emu_tensor._op_cache) == before + 2
    finally:
        gt.uninstall()


def _conv_busy_us(gpu: str) -> float:
    emu = gt.install(gpu)
    try:
        x, w = torch.empty(64, 32, 26, 26, device="cuda"), torch.empty(64, 32, 3, 3, device="cuda")
        torch.cuda.synchronize()
        busy0 = emu.devices[0].busy_s()
        torch.nn.functional.conv2d(x, w)
        torch.cuda.synchronize()
        return (emu.devices[0].busy_s() - busy0) * 1e6
    finally:
        gt.uninstall()


def test_a_second_install_with_another_gpu_prices_ops_for_that_gpu() -> None:
    # Note [Caches per emulation]: a 3x3 fp32 convolution, 64 x 32 x 26 x 26 -> 64 channels, is 1.36 GFLOP:
    # 156.1 us on a V100 (CUDA cores; its fitted compute factor a = 1.0723), 18.2 us on an A100 (TF32 tensor cores,
    # torch's default for convolutions).
    # Before, the A100 after the V100 in one process read the V100's cached 156.2 us
    v100 = _conv_busy_us("v100")
    a100 = _conv_busy_us("a100")
    assert v100 == pytest.approx(156.1, abs=0.1)
    assert a100 == pytest.approx(18.2, abs=0.1)
    assert _conv_busy_us("v100") == pytest.approx(v100)  # and back again
