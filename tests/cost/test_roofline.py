"""Tests for gpemu.cost.roofline.op_time_s: the per-op seam the torch backend calls, cached and fast."""

from __future__ import annotations

import time

import torch

from gpemu.cost.roofline import clear_cache, op_time_s
from gpemu.hardware import get_gpu

aten = torch.ops.aten


def test_op_time_is_cached_and_fast() -> None:
    clear_cache()
    a, b = torch.empty(1024, 1024, device="meta"), torch.empty(1024, 1024, device="meta")
    out = aten.mm(a, b)
    spec = get_gpu("v100")
    first = op_time_s(aten.mm.default, (a, b), {}, out, spec)
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        again = op_time_s(aten.mm.default, (a, b), {}, out, spec)
    per_call_s = (time.perf_counter() - start) / n
    assert again == first
    assert per_call_s < 30e-6  # target < 10 us; loose bound for a loaded CI machine


def test_faster_gpu_is_faster_on_a_big_matmul() -> None:
    a, b = torch.empty(4096, 4096, device="meta"), torch.empty(4096, 4096, device="meta")
    out = aten.mm(a, b)
    k80 = op_time_s(aten.mm.default, (a, b), {}, out, get_gpu("k80"))
    h100 = op_time_s(aten.mm.default, (a, b), {}, out, get_gpu("h100-sxm5-80gb"))
    # 2 * 4096^3 = 1.37e11 FLOPs: at most 4.37e12 * 3 FLOP/s on a K80 -> >= 10 ms
    assert k80 > 0.010
    assert h100 < k80 / 5


def test_dilated_convolutions_are_not_priced_as_winograd() -> None:
    # Note [Dilated convolutions]: DeepLabV3's ASPP convolution, 960 -> 256 channels, 3x3, dilation 12, on a 4 x 30 x 30
    # map: 2 * 4 * 900 * 256 * 960 * 9 = 15.9 GFLOP. cuDNN has no Winograd/FFT kernel for a dilation above 1, so
    # on the V100's CUDA cores (fp32, no TF32) it cannot beat the 15.7 TFLOP/s peak: >= 15.9e9 / 15.7e12 = 1.01 ms.
    # It was priced as the undilated (Winograd) convolution, 0.57 ms: 28 TFLOP/s
    clear_cache()
    x, w = torch.empty(4, 960, 30, 30, device="meta"), torch.empty(256, 960, 3, 3, device="meta")
    spec = get_gpu("v100-sxm2-32gb")
    flops = 2 * 4 * 900 * 256 * 960 * 9
    times = {}
    for dilation in (1, 12):
        args = (x, w, None, [1, 1], [dilation, dilation], [dilation, dilation], False, [0, 0], 1)
        out = aten.convolution(*args)
        times[dilation] = op_time_s(aten.convolution.default, args, {}, out, spec)
    assert flops / times[12] <= spec.peak_tflops["fp32"] * 1e12
    assert times[12] > 1.5 * times[1]  # the undilated 3x3 keeps its Winograd efficiency
    grad = torch.empty(4, 256, 30, 30, device="meta")
    bwd = {}
    for dilation in (1, 12):  # the backward likewise: the 1x1 (GEMM) efficiency, not the Winograd one
        bwd_args = (grad, x, w, [256], [1, 1], [dilation] * 2, [dilation] * 2, False, [0, 0], 1, [True, True, False])
        outs = aten.convolution_backward(*bwd_args)
        bwd[dilation] = op_time_s(aten.convolution_backward.default, bwd_args, {}, outs, spec)
    assert bwd[12] > 1.5 * bwd[1]
