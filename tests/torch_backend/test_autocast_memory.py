"""Autocast's 16-bit copies take device memory from the forward that makes them to the backward that uses them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import gpemu.torch_backend as gt

MIB = 2**20
WS_MIB = (4096 * 1024 * 2 + 16 * 1024 * 8) / MIB  # cuBLAS's default workspace before Hopper: 8.125 MiB


@pytest.fixture
def a100() -> Iterator[gt.Emulation]:
    e = gt.install("a100", replay=False)
    yield e
    gt.uninstall()


def _mib() -> float:
    return torch.cuda.memory_allocated() / MIB


def test_casts_live_until_backward_and_weights_are_cast_once(a100: gt.Emulation) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096, bias=False)).cuda()  # 2 x 4096*4096*4 B = 2 x 64 MiB
    x = torch.randn(64, 4096, device="cuda")  # 1 MiB fp32
    base = _mib()
    with torch.autocast("cuda", dtype=torch.float16):
        y = model(x)
        y2 = model[0](x)  # the first weight again: autocast's cache holds one copy per region
    # casts: x -> 0.5 MiB (twice: a non-parameter input is cast per use), W1 and W2 -> 32 MiB each (once, though W1
    # is used twice); live fp16 activations: relu out (ReLU saves its output; linear1's own output is freed) 0.5,
    # y 0.5, y2 0.5; and the first GEMM's cuBLAS workspace, 4096 KiB * 2 + 16 KiB * 8 = 8.125 MiB on an A100 (Note
    # [cuBLAS workspace in the drop-in])
    assert _mib() - base == pytest.approx(0.5 * 2 + 32 * 2 + 0.5 * 3 + WS_MIB)
    (y.float().mean() + y2.float().mean()).backward()
    del y, y2
    # what remains: the two fp32 weight gradients (2 x 64 MiB); every cast was freed with the backward pass; the
    # autograd thread's handle took its own workspace
    assert _mib() - base == pytest.approx(128.0 + 2 * WS_MIB)


def test_inference_casts_are_freed_at_the_end_of_the_region(a100: gt.Emulation) -> None:
    model = torch.nn.Linear(4096, 4096, bias=False).cuda()
    x = torch.randn(64, 4096, device="cuda")
    base = _mib()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
        # the weight's 16-bit copy (32 MiB) is cached for the region; the input's cast is transient without grad
        assert _mib() - base == pytest.approx(32 + 0.5 + WS_MIB)  # + the fp16 output, + the cuBLAS workspace
    assert _mib() - base == pytest.approx(0.5 + WS_MIB)  # the copy is gone, the output and the workspace stay
    del out


def test_autocast_fp32_ops_return_fp32(a100: gt.Emulation) -> None:
    # Note [Autocast's fp32 ops]: under autocast(float16) layer_norm / softmax / log_softmax of an fp16 activation
    # run in fp32 and return fp32, as on a GPU; the fp32 copy of the input is not held (the fp32 output, 4 MiB here:
    # 1M elements x 4 B, is what the step allocates).
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.float16, requires_grad=True)  # 2 MiB
    ln = torch.nn.LayerNorm(1024).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        before = _mib()
        y = ln(x)
        held = _mib() - before
        s = torch.softmax(x, dim=-1)
        ls = torch.log_softmax(x, dim=-1)
        half = torch.softmax(x, dim=-1, dtype=torch.float32)  # half_to_float: already fp32, no extra cast
    assert (y.dtype, s.dtype, ls.dtype, half.dtype) == (torch.float32,) * 4
    assert held == pytest.approx(4, abs=0.6)  # the fp32 output (4 MiB)
    y.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float16
