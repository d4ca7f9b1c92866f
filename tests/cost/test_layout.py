"""Memory format (NCHW vs channels_last): Note [Memory format] in registry.py, Note [Layout cost] in model.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpemu.cost.model import (
    LAYOUT_NCHW,
    LAYOUT_NHWC,
    LAYOUT_NONE,
    load_params,
    native_conv_layout,
    spec_columns,
)
from gpemu.cost.predict import batch_linear_ops, model_phase_seconds, predict_phase
from gpemu.cost.registry import op_cost, op_layout, tensor_layout
from gpemu.cost.roofline import cost_time_s
from gpemu.errors import GpemuError
from gpemu.hardware import get_gpu

aten = torch.ops.aten
CL = torch.channels_last


def _conv(x: torch.Tensor, w: torch.Tensor, stride: int = 1) -> tuple[tuple, torch.Tensor]:
    pad = w.shape[-1] // 2
    args = (x, w, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)
    return args, aten.convolution.default(*args)


def test_layout_is_read_from_strides() -> None:
    x = torch.empty(2, 16, 8, 8, device="meta")
    assert tensor_layout(x) == "nchw"
    assert tensor_layout(x.contiguous(memory_format=CL)) == "nhwc"
    assert tensor_layout(torch.empty(2, 16, 1, 1, device="meta")) == ""  # both formats at once: no format
    assert tensor_layout(torch.empty(2, 16, device="meta")) == ""
    # an NCHW input with a channels_last weight runs channels_last (cudnn_conv_suggest_memory_format)
    w = torch.empty(32, 16, 3, 3, device="meta").contiguous(memory_format=CL)
    assert op_layout((x, w)) == "nhwc"


def test_conv_relayout_bytes() -> None:
    x = torch.empty(2, 16, 8, 8, device="meta", dtype=torch.float16)
    w3 = torch.empty(32, 16, 3, 3, device="meta", dtype=torch.float16)
    args, out = _conv(x, w3)
    cost = op_cost(aten.convolution.default, args, {}, out)
    # x: 2*16*8*8 * 2 bytes = 4096; y: 2*32*8*8 * 2 bytes = 8192 -> 12288 (the weight is not transposed)
    assert (cost.layout, cost.relayout_bytes) == ("nchw", 12288)
    w1 = torch.empty(32, 16, 1, 1, device="meta", dtype=torch.float16)
    args, out = _conv(x, w1)
    # 1x1 stride 1 transposes too (Note [Layout cost]: timm's NCHW / NHWC pairs): x 4096 + y 8192 -> 12288
    assert op_cost(aten.convolution.default, args, {}, out).relayout_bytes == 12288
    args, out = _conv(x, w1, stride=2)
    # stride 2: x 4096 + y 2*32*4*4 * 2 = 2048 -> 6144
    assert op_cost(aten.convolution.default, args, {}, out).relayout_bytes == 6144


def test_native_conv_layout_per_arch() -> None:
    v100, a100 = get_gpu("v100-sxm2-32gb"), get_gpu("a100")
    assert native_conv_layout(v100, "fp16", True) == LAYOUT_NHWC  # tensor cores
    assert native_conv_layout(v100, "fp32", False) == LAYOUT_NCHW  # CUDA cores: all the calibration data
    assert native_conv_layout(a100, "fp32", False) == LAYOUT_NONE  # TF32: layout-neutral, no transposes
    assert native_conv_layout(a100, "bf16", True) == LAYOUT_NHWC
    assert native_conv_layout(get_gpu("p100-pcie-16gb"), "fp16", True) == LAYOUT_NCHW  # no tensor cores


def _conv_pair(dtype: torch.dtype) -> tuple[float, float, float]:
    """Return (NCHW seconds, NHWC seconds, relayout bytes) of one 3x3 conv on a V100-SXM2."""
    spec = get_gpu("v100-sxm2-32gb")
    x = torch.empty(32, 64, 56, 56, device="meta", dtype=dtype)
    w = torch.empty(64, 64, 3, 3, device="meta", dtype=dtype)
    a_nchw, o_nchw = _conv(x, w)
    a_nhwc, o_nhwc = _conv(x.contiguous(memory_format=CL), w.contiguous(memory_format=CL))
    c_nchw = op_cost(aten.convolution.default, a_nchw, {}, o_nchw)
    c_nhwc = op_cost(aten.convolution.default, a_nhwc, {}, o_nhwc)
    assert c_nhwc.layout == "nhwc" and c_nchw.relayout_bytes == c_nhwc.relayout_bytes
    return (cost_time_s(c_nchw, "convolution", spec), cost_time_s(c_nhwc, "convolution", spec),
            c_nchw.relayout_bytes)


def _conv_backward(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    """Return (bytes transposed, seconds) of one 3x3 convolution's backward (dx and dw) on a V100-SXM2."""
    _, y = _conv(x, w)
    bargs = (torch.empty_like(y), x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    cost = op_cost(aten.convolution_backward.default, bargs, {}, aten.convolution_backward.default(*bargs))
    return cost.relayout_bytes, cost_time_s(cost, "convolution_backward", get_gpu("v100-sxm2-32gb"))


def test_foreign_layout_pays_its_transposes() -> None:
    params = load_params()
    p, f = params.shared, params.factors(get_gpu("v100-sxm2-32gb"))
    latency = p["mem_lat_cycles"] / 1530e6  # cycles at the 1530 MHz boost clock
    # fp16: NHWC is native. Note [NCHW forward on cuDNN 9]: an NCHW forward runs NCHW-native kernels, no transposes
    nchw, nhwc, moved = _conv_pair(torch.float16)
    assert moved == (32 * 64 * 56 * 56 * 2) * 2  # x and y, 12.8 MB each in fp16
    assert nchw == nhwc
    # its backward transposes dy, x and dx (12.8 MB each), read + written once, streamed at m_stream of the
    # datasheet 900 GB/s (Note [16-bit streaming]), + 3 launches
    x = torch.empty(32, 64, 56, 56, device="meta", dtype=torch.float16)
    w = torch.empty(64, 64, 3, 3, device="meta", dtype=torch.float16)
    moved_b, nchw_b = _conv_backward(x, w)
    _, nhwc_b = _conv_backward(x.contiguous(memory_format=CL), w.contiguous(memory_format=CL))
    assert moved_b == 3 * (32 * 64 * 56 * 56 * 2)
    transposes = 2 * moved_b / (900e9 * params.m_stream) + 3 * (latency + p["k0"])
    assert nchw_b - nhwc_b == pytest.approx(transposes, rel=1e-9)
    # fp32 on CUDA cores: NCHW is native, an NHWC forward pays the transposes of x and y (twice the fp16 bytes), at
    # the fitted elementwise efficiency and the borrowed memory factor b
    nchw32, nhwc32, moved32 = _conv_pair(torch.float32)
    assert moved32 == 2 * moved
    bw = 900e9 * f["b"]
    assert nhwc32 - nchw32 == pytest.approx(2 * moved32 / (bw * p["m_elementwise"]) + 2 * (latency + p["k0"]),
                                            rel=1e-9)


def test_nhwc_batch_norm_has_no_plane_ramp() -> None:
    params = load_params()
    spec = get_gpu("a100")
    p, f = params.shared, params.factors(spec)
    x = torch.empty(64, 256, 7, 7, device="meta")  # fp32: the fitted m_norm (16-bit streams at m_stream)
    w = torch.empty(256, device="meta")
    args = (x, w, w, w.clone(), w.clone(), True, 0.1, 1e-5)
    cost = op_cost(aten.native_batch_norm.default, args, {}, None)
    cost_cl = op_cost(aten.native_batch_norm.default, (x.contiguous(memory_format=CL), *args[1:]), {}, None)
    assert (cost.layout, cost_cl.layout, cost.bytes) == ("nchw", "nhwc", 3 * 64 * 256 * 49 * 4)
    fixed = p["mem_lat_cycles"] / 1410e6 + p["k0"]
    bw = 2039e9 * f["b"]
    ramp = 49 / (49 + p["bn_plane_half"])  # 7x7 planes: well below the ramp's half point
    assert cost_time_s(cost, "native_batch_norm", spec, plane=49.0) == pytest.approx(
        cost.bytes / (bw * p["m_norm"] * ramp) + fixed, rel=1e-9)
    # NHWC: the same ceiling, no ramp
    assert cost_time_s(cost_cl, "native_batch_norm", spec, plane=49.0) == pytest.approx(
        cost.bytes / (bw * p["m_norm"]) + fixed, rel=1e-9)


def test_fp32_nchw_columns_unchanged_on_calibration_gpus() -> None:
    ops = batch_linear_ops("resnet18", "fp32")
    for gpu in ("k80", "m40", "p100-pcie-16gb", "quadro-rtx-6000", "v100-pcie-32gb"):
        cols = spec_columns(ops, get_gpu(gpu), 0.5)
        assert not cols.relayout.any() and not cols.stream.any() and not cols.tensor_core.any()
        assert np.isfinite(cols.plane).sum() == 2 * 20 + 0  # 20 batch norms, forward and backward, keep their ramp


def test_channels_last_amp_step_is_faster_than_nchw() -> None:
    spec = get_gpu("a100")
    nchw = model_phase_seconds(spec, "resnet18", "backward", [64], "amp")[0]
    nhwc = model_phase_seconds(spec, "resnet18", "backward", [64], "amp", memory_format="channels_last")[0]
    assert nhwc < nchw
    ops = batch_linear_ops("resnet18", "amp", memory_format="channels_last")
    kinds = {n: set() for n in ("convolution", "native_batch_norm")}
    for name, lay in zip(ops.names, ops.layout, strict=True):
        if name in kinds:
            kinds[name].add(int(lay))
    assert kinds == {"convolution": {LAYOUT_NHWC}, "native_batch_norm": {LAYOUT_NHWC}}  # conv outputs follow
    assert math.isfinite(nhwc)


def test_unknown_memory_format() -> None:
    with pytest.raises(GpemuError, match="channels_last"):
        predict_phase("a100", "resnet18", "forward", 8, memory_format="nhwc8")
