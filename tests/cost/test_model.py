"""Tests for gpemu.cost.model: the packaged fitted constants, effective peaks and the async phase formula."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from gpemu.cost.model import (
    SHARED_PARAMS,
    CostParams,
    bn_plane,
    load_params,
    op_arrays,
    peak_flops,
    phase_seconds,
    plane_efficiency,
    spec_columns,
    uses_tensor_cores,
)
from gpemu.hardware import get_gpu, list_gpus


def test_fitted_constants_load_with_provenance() -> None:
    params = load_params()
    assert "ROWS.csv" in params.note  # says which data it was fitted on
    for name in SHARED_PARAMS:
        assert math.isfinite(params.shared[name]) and params.shared[name] > 0, name
    catalog = {g.key for g in list_gpus()}
    assert set(params.per_gpu) <= catalog


def test_phase_is_gpu_bound_or_host_bound() -> None:
    p = {"t0": 0.0}
    kernels = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    # GPU-bound: host 0.5 per op -> max(0.5 + 3, 1.0 + 2, 1.5 + 1) = 3.5
    assert float(phase_seconds(kernels, torch.full((3,), 0.5, dtype=torch.float64), p, "forward")) == 3.5
    # host-bound: host 2 per op -> max(2 + 3, 4 + 2, 6 + 1) = 7
    assert float(phase_seconds(kernels, torch.full((3,), 2.0, dtype=torch.float64), p, "forward")) == 7.0


def test_effective_peaks_follow_tensor_core_rules() -> None:
    v100, a100, p100 = get_gpu("v100"), get_gpu("a100"), get_gpu("p100-pcie-16gb")
    # fp32 conv on Ampere uses TF32 tensor cores: the 156e12 TF32 peak, priced at tc_eff
    assert peak_flops(a100, "fp32", "conv", False) == 156e12 and uses_tensor_cores(a100, "fp32", "conv", False)
    assert peak_flops(a100, "fp32", "matmul", False) == 19.5e12  # cuBLAS keeps fp32 off TF32 by default
    assert not uses_tensor_cores(a100, "fp32", "matmul", False)
    assert peak_flops(v100, "fp16", "matmul", True) == 112e12  # the tensor-core peak
    # misaligned 16-bit (Note [Misaligned GEMMs]): still tensor cores, at MISALIGNED_TC_FRACTION 0.5 of 112e12
    assert peak_flops(v100, "fp16", "matmul", False) == 56e12
    assert uses_tensor_cores(v100, "fp16", "matmul", False)
    assert peak_flops(p100, "fp16", "conv", True) == 18.7e12  # no tensor cores: packed half2
    assert not uses_tensor_cores(p100, "fp16", "conv", True)
    assert peak_flops(v100, "bf16", "matmul", True) == 14e12  # no native bf16 before Ampere
    assert not uses_tensor_cores(v100, "fp16", "elementwise", True)  # only conv/matmul/attention


def test_tensor_core_ops_use_tc_eff_not_the_cuda_core_fit() -> None:
    # Note [Tensor-core efficiency]: compute_s = (F + w_half * SMs) / (peak_tc * tc_eff) + k0, no e_c, no a
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    params = load_params()
    p = params.shared
    h100 = get_gpu("h100-sxm5-80gb")
    n = 8192
    gemm = OpCost(2 * n**3, 3 * n * n * 2, "matmul", "bf16", tensor_core=True)  # 1.1e12 FLOPs, 403 MB
    compute = (2 * n**3 + p["w_half"] * 132) / (989.5e12 * params.tc_eff)  # 132 SMs; ~1.44 ms at tc_eff 0.77
    memory = 3 * n * n * 2 / (3350e9 * params.factors(h100)["b"] * p["m_elementwise"])  # ~0.25 ms: compute-bound
    assert compute > memory
    assert cost_time_s(gemm, "mm", h100, params) == pytest.approx(compute + p["k0"], rel=1e-12)
    # the same GEMM in fp32 on a V100-PCIe stays on CUDA cores with the fitted e_matmul and its own a
    v100 = get_gpu("v100-pcie-32gb")
    fp32 = OpCost(2 * n**3, 3 * n * n * 4, "matmul", "fp32")
    a = params.per_gpu["v100-pcie-32gb"]["a"]
    assert cost_time_s(fp32, "mm", v100, params) == pytest.approx(
        (2 * n**3 + p["w_half"] * 80) / (14e12 * p["e_matmul"] * a) + p["k0"], rel=1e-12)


def test_fused_attention_is_priced_at_its_published_efficiency() -> None:
    # Note [Fused attention efficiency]: FlashAttention-2 reaches 0.60 of the tensor peak before Hopper (A100:
    # 50-73 %, geometric mean) and 0.35 on Hopper, where a large GEMM reaches tc_eff (0.77)
    from gpemu.cost.model import FUSED_ATTENTION_EFF, FUSED_ATTENTION_EFF_HOPPER, fused_attention_eff
    from gpemu.cost.registry import OpCost, sdpa_flops
    from gpemu.cost.roofline import cost_time_s

    params = load_params()
    p = params.shared
    # GPT-2 attention, batch 8 x 12 heads x 1024 tokens x head dim 64, causal: 4*96*1024^2*64 / 2 = 1.29e10 FLOPs
    flops = sdpa_flops((8, 12, 1024, 64), (8, 12, 1024, 64), (8, 12, 1024, 64), causal=True)
    assert flops == 4 * 96 * 1024**2 * 64 // 2
    attn = OpCost(flops, 4 * 8 * 12 * 1024 * 64 * 2, "attention", "bf16", tensor_core=True)  # q, k, v, o: 25 MB
    for key, sms, peak, eff in (("a100-sxm4-80gb", 108, 312e12, FUSED_ATTENTION_EFF),
                                ("h100-sxm5-80gb", 132, 989.5e12, FUSED_ATTENTION_EFF_HOPPER)):
        spec = get_gpu(key)
        assert fused_attention_eff(spec, params.tc_eff) == eff < params.tc_eff
        # A100: (1.29e10 + 1.4e8) / (312e12 * 0.60) = 69.6 us; H100: (1.29e10 + 1.7e8) / (989.5e12 * 0.35) = 37.7 us
        compute = (flops + p["w_half"] * sms) / (peak * eff)
        assert cost_time_s(attn, "_scaled_dot_product_flash_attention", spec, params) == pytest.approx(
            compute + p["k0"], rel=1e-12)
        gemm = OpCost(flops, 1e6, "matmul", "bf16", tensor_core=True)  # the same FLOPs in a GEMM (1 MB): at tc_eff
        assert cost_time_s(gemm, "mm", spec, params) == pytest.approx(
            (flops + p["w_half"] * sms) / (peak * params.tc_eff) + p["k0"], rel=1e-12)
    # Datacenter Blackwell (cc 10.0) prices FlashAttention-2 as Hopper does; the Blackwell RTX SM (cc 12.0) has no
    # warpgroup MMA or tcgen05, its GEMMs run mma.sync as FlashAttention-2 does: Ada's 0.60 (Note [Blackwell RTX SM])
    assert fused_attention_eff(get_gpu("b200"), params.tc_eff) == FUSED_ATTENTION_EFF_HOPPER
    for key in ("rtx5090", "rtx-pro-6000-maxq", "rtx4090"):
        assert fused_attention_eff(get_gpu(key), params.tc_eff) == FUSED_ATTENTION_EFF, key


def test_16_bit_streaming_ops_use_m_stream() -> None:
    # Note [16-bit streaming]: memory_s = M / (bw * m_stream) + latency, no per-GPU b; fp32 keeps m_c * b
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    params = load_params()
    p = params.shared
    a100 = get_gpu("a100")
    latency = p["mem_lat_cycles"] / 1410e6 + p["k0"]  # 1410 MHz boost clock
    relu16 = OpCost(1e8, 4e8, "elementwise", "fp16")  # 400 MB read + written
    assert cost_time_s(relu16, "relu", a100, params) == pytest.approx(4e8 / (2039e9 * params.m_stream) + latency)
    relu32 = OpCost(1e8, 4e8, "elementwise", "fp32")
    b = params.factors(a100)["b"]  # borrowed from the nearest fitted GPU (Note [Borrowed factors])
    assert cost_time_s(relu32, "relu", a100, params) == pytest.approx(4e8 / (2039e9 * p["m_elementwise"] * b)
                                                                      + latency)
    gather16 = OpCost(1e8, 4e8, "embedding", "fp16")  # not a streaming category: the fitted m_other
    assert cost_time_s(gather16, "embedding", a100, params) == pytest.approx(
        4e8 / (2039e9 * p["m_other"] * b) + latency)
    # a pooling forward: at least its issue time, 1e8 counted elements / (0.47 per SM cycle x 108 SMs x 1410 MHz)
    # = 1.397 ms, over the 0.26 ms its bytes stream in (Note [Pooling kernels are issue-bound])
    pool16 = OpCost(1e8, 4e8, "pooling", "fp16")
    assert cost_time_s(pool16, "max_pool2d_with_indices", a100, params) == pytest.approx(
        1e8 / (0.47 * 108 * 1410e6) + latency)


def test_batch_norm_plane_size() -> None:
    # NCHW batch norm streams H*W contiguous elements per (n, c): 56 * 56 = 3136
    assert bn_plane("native_batch_norm", (32, 64, 56, 56)) == 3136.0
    assert bn_plane("native_batch_norm_backward", (32, 2048, 7, 7)) == 49.0  # 7 * 7
    assert bn_plane("native_batch_norm", (32, 512)) == math.inf  # BatchNorm1d: contiguous across channels
    assert bn_plane("relu", (32, 64, 56, 56)) == math.inf  # not a batch norm: no ramp


def test_batch_norm_efficiency_ramps_with_plane_size() -> None:
    eff = plane_efficiency(np.array([49.0, 256.0, 50176.0, np.inf]), 256.0).tolist()
    assert eff[0] == pytest.approx(49 / (49 + 256))  # 0.1607: a 7x7 plane
    assert eff[1] == pytest.approx(0.5)  # P = half
    assert eff[2] == pytest.approx(50176 / (50176 + 256))  # 0.9949: a 224x224 plane streams at full speed
    assert eff[3] == 1.0  # other ops


def test_batch_norm_time_scales_with_plane_efficiency() -> None:
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    v100 = get_gpu("v100")
    shared = {**load_params().shared, "bn_plane_half": 256.0, "mem_lat_cycles": 0.0, "k0": 0.0, "m_norm": 0.5}
    params = CostParams(shared, {})
    cost = OpCost(0, 9e8, "norm", "fp32")  # 0.9 GB, memory-bound
    # 9e8 B / (900e9 B/s * 0.5) = 2 ms at full efficiency; a 256-element plane halves it: 4 ms
    assert cost_time_s(cost, "native_batch_norm", v100, params) == pytest.approx(2e-3)
    assert cost_time_s(cost, "native_batch_norm", v100, params, plane=256.0) == pytest.approx(4e-3)


def test_op_arrays_plane_from_records() -> None:
    from types import SimpleNamespace

    from gpemu.cost.model import op_arrays

    common = {"phase": "forward", "flops": 0.0, "bytes": 0.0, "dtype": "fp32", "tensor_core": False}
    bn = SimpleNamespace(name="native_batch_norm", category="norm", in_shapes=((8, 64, 14, 14),), **common)
    bare = SimpleNamespace(name="native_batch_norm", category="norm", **common)  # OpRecord-like, no shapes
    plane = op_arrays([bn, bare]).plane
    assert plane is not None
    assert plane.tolist() == [196.0, math.inf]  # 14 * 14; no shapes -> no ramp


def test_k80_is_priced_at_its_sustained_clock() -> None:
    # Note [Sustained clock]: K80 fp32 peak 4.37 TFLOPS at 875 MHz -> 4.37 * 562 / 875 = 2.807 TFLOPS at 562 MHz;
    # bandwidth 240 * 562 / 705 = 191.3 GB/s; memory latency counted in 562 MHz cycles.
    k80 = get_gpu("k80")
    assert peak_flops(k80, "fp32", "conv", False) == pytest.approx(2.8068e12, rel=1e-4)
    from types import SimpleNamespace

    add = SimpleNamespace(name="add", category="elementwise", phase="forward", flops=0.0, bytes=1e6, dtype="fp32",
                          tensor_core=False)
    ops = op_arrays([add])
    cols = spec_columns(ops, k80, 0.5)
    assert cols.bw == pytest.approx(191.319e9, rel=1e-4)
    assert cols.clock_hz == 562e6
    # a GPU without a sustained clock keeps its datasheet figures: V100-PCIe 14 TFLOPS, 900 GB/s, 1380 MHz
    v100 = get_gpu("v100-pcie-32gb")
    assert peak_flops(v100, "fp32", "conv", False) == 14.0e12
    cols = spec_columns(ops, v100, 0.5)
    assert (cols.bw, cols.clock_hz) == (900e9, 1380e6)


def test_pointwise_convolutions_are_recognised_by_their_weight() -> None:
    from gpemu.cost.model import compute_param_index, is_pointwise_conv

    x, w1, w3 = (8, 64, 56, 56), (256, 64, 1, 1), (64, 64, 3, 3)
    assert is_pointwise_conv("convolution", "conv", (x, w1))
    assert not is_pointwise_conv("convolution", "conv", (x, w3))
    assert is_pointwise_conv("convolution_backward", "conv", ((8, 256, 56, 56), x, w1))  # (grad_out, input, weight)
    assert not is_pointwise_conv("convolution", "conv_grouped", (x, (64, 1, 1, 1)))  # grouped keep e_grouped
    assert not is_pointwise_conv("mm", "matmul", ((8, 64), (64, 64)))
    # e_conv, e_conv_bwd for 3x3; e_conv_1x1 (5), e_conv_1x1_bwd (6) for 1x1
    assert compute_param_index("conv", "convolution", False) == 0
    assert compute_param_index("conv", "convolution", True) == 5
    assert compute_param_index("conv", "convolution_backward", True) == 6


def test_pointwise_convolutions_are_priced_at_their_own_efficiency() -> None:
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    v100 = get_gpu("v100")
    shared = {**load_params().shared, "w_half": 0.0, "k0": 0.0, "mem_lat_cycles": 0.0, "e_conv": 2.0,
              "e_conv_1x1": 0.5}
    params = CostParams(shared, {})
    cost = OpCost(1.4e12, 1.0, "conv", "fp32")  # compute-bound: 1.4 TFLOP
    # 3x3 (Winograd): 1.4e12 / (14e12 * 2.0) = 50 ms; 1x1 (GEMM): 1.4e12 / (14e12 * 0.5) = 200 ms
    assert cost_time_s(cost, "convolution", v100, params) == pytest.approx(0.05)
    assert cost_time_s(cost, "convolution", v100, params, pointwise=True) == pytest.approx(0.2)


def test_spatial_cuda_core_convolutions_add_compute_and_transform_traffic() -> None:
    # Note [Staged convolutions]: a CUDA-core 3x3 convolution is transform + GEMM + transform, so compute and
    # memory add; 1x1 (one GEMM kernel) and tensor-core convolutions keep the roofline's max.
    from types import SimpleNamespace

    from gpemu.cost.model import kernel_seconds
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    v100 = get_gpu("v100-pcie-32gb")  # 14 TFLOPS fp32, 112 TFLOPS fp16 tensor, 900 GB/s
    shared = {**load_params().shared, "w_half": 0.0, "k0": 0.0, "mem_lat_cycles": 0.0, "e_conv": 2.0,
              "e_conv_bwd": 2.0, "e_conv_1x1": 0.5, "m_conv": 0.2, "m_conv_bwd": 0.4, "m_elementwise": 0.5}
    params = CostParams(shared, {}, tc_eff=0.7)  # no per-GPU factors: a = b = 1
    cost = OpCost(1.4e11, 3.6e8, "conv", "fp32")  # 140 GFLOP, 360 MB
    # 3x3: 1.4e11 / (14e12 * 2.0) = 5 ms compute + 3.6e8 / (900e9 * 0.2) = 2 ms transforms = 7 ms (the max: 5 ms)
    assert cost_time_s(cost, "convolution", v100, params) == pytest.approx(7e-3)
    # its backward at m_conv_bwd: 5 ms + 3.6e8 / (900e9 * 0.4) = 1 ms -> 6 ms
    assert cost_time_s(cost, "convolution_backward", v100, params) == pytest.approx(6e-3)
    # 1x1: max(1.4e11 / (14e12 * 0.5) = 20 ms, 3.6e8 / (900e9 * 0.5) = 0.8 ms) = 20 ms
    assert cost_time_s(cost, "convolution", v100, params, pointwise=True) == pytest.approx(20e-3)
    # fp16 on tensor cores: max(1.4e11 / (112e12 * 0.7) = 1.786 ms, 0.8 ms) = 1.786 ms
    tc = OpCost(1.4e11, 3.6e8, "conv", "fp16", tensor_core=True)
    assert cost_time_s(tc, "convolution", v100, params) == pytest.approx(1.4e11 / (112e12 * 0.7))
    # the phase model (kernel_seconds over spec_columns) prices the same ops the same way
    recs = [SimpleNamespace(name="convolution", category="conv", phase=ph, flops=1.4e11, bytes=3.6e8, dtype=dt,
                            tensor_core=dt == "fp16") for ph, dt in (("forward", "fp32"), ("forward", "fp16"))]
    ops = op_arrays(recs)
    kern = kernel_seconds(ops.flops, ops.bytes, spec_columns(ops, v100, 0.7), shared, params.factors(v100))
    assert kern.tolist() == pytest.approx([7e-3, 1.4e11 / (112e12 * 0.7)])


def test_group_width_is_read_from_the_weight() -> None:
    from gpemu.cost.model import conv_group_width

    x = (8, 256, 56, 56)
    # ResNeXt-101 32x8d's first grouped conv: 256 channels in 32 groups, weight (256, 256 / 32 = 8, 3, 3)
    assert conv_group_width("convolution", "conv_grouped", (x, (256, 8, 3, 3))) == 8.0
    assert conv_group_width("convolution", "conv_grouped", (x, (256, 1, 3, 3))) == 1.0  # depthwise
    assert conv_group_width("convolution_backward", "conv_grouped", (x, x, (256, 8, 3, 3))) == 8.0
    assert conv_group_width("convolution", "conv", (x, (256, 256, 3, 3))) == 1.0  # dense: not a grouped op


def test_group_efficiency_runs_from_depthwise_to_dense_in_log_space() -> None:
    from gpemu.cost.model import group_efficiency

    e_g, e_d, half = 0.1, 0.9, 16.0
    assert float(group_efficiency(e_g, e_d, 1.0, half)) == pytest.approx(0.1)  # depthwise: unchanged
    # half way (g - 1 = half): the geometric mean sqrt(0.1 * 0.9) = 0.3
    assert float(group_efficiency(e_g, e_d, 17.0, half)) == pytest.approx(0.3)
    assert float(group_efficiency(e_g, e_d, 1e6, half)) == pytest.approx(0.9, rel=1e-4)  # wide groups: dense


def test_a_wide_grouped_convolution_is_priced_faster_than_a_depthwise_one() -> None:
    from gpemu.cost.model import group_efficiency
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    v100, params = get_gpu("v100"), load_params()
    p, a = params.shared, params.factors(get_gpu("v100"))["a"]
    flops = 2 * 64 * 256 * 8 * 9 * 56 * 56  # batch 64, 256 out channels, 8 in per group, 3x3 kernel, 56x56 output
    cost = OpCost(float(flops), 1e3, "conv_grouped")  # 1 kB: compute-bound
    depthwise = cost_time_s(cost, "convolution", v100, params, group_width=1.0)
    wide = cost_time_s(cost, "convolution", v100, params, group_width=8.0)
    # same FLOPs, efficiency e_grouped vs group_efficiency(e_grouped, e_conv_1x1, 8): compute time scales by the ratio
    ratio = float(group_efficiency(p["e_grouped"], p["e_conv_1x1"], 8.0, p["group_width_half"])) / p["e_grouped"]
    latency = p["k0"]
    compute = (flops + p["w_half"] * v100.sm_count) / (v100.peak_tflops["fp32"] * 1e12 * p["e_grouped"] * a)
    assert depthwise == pytest.approx(compute + latency, rel=1e-6)
    assert wide == pytest.approx(compute / ratio + latency, rel=1e-6)
    assert ratio > 1


def test_16bit_depthwise_convolution_runs_on_cuda_cores() -> None:
    from gpemu.cost.model import uses_tensor_cores
    from gpemu.cost.registry import op_cost
    from gpemu.cost.roofline import cost_time_s

    a100, params = get_gpu("a100"), load_params()
    p, a = params.shared, params.factors(a100)["a"]
    x = torch.empty(64, 256, 56, 56, device="meta", dtype=torch.float16)
    w = torch.empty(256, 1, 3, 3, device="meta", dtype=torch.float16)  # depthwise: one channel per group
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 256)
    cost = op_cost(torch.ops.aten.convolution.default, args, {}, torch.ops.aten.convolution.default(*args))
    assert (cost.category, cost.tensor_core) == ("conv_grouped", False)
    # Note [Narrow groups on CUDA cores]: no tensor cores, the fp32 CUDA-core peak (19.5 TFLOP/s) at e_grouped * a
    assert not uses_tensor_cores(a100, "fp16", "conv_grouped", False)
    flops = 2 * 64 * 256 * 9 * 56 * 56  # 925 MFLOP
    compute = (flops + p["w_half"] * a100.sm_count) / (19.5e12 * p["e_grouped"] * a)
    assert cost_time_s(cost, "convolution", a100, params) >= compute  # the max with the memory side, plus k0
    # a group width of 16 is a GEMM per group: tensor cores, as the aligned 16-bit convolutions
    assert uses_tensor_cores(a100, "fp16", "conv_grouped", True)
    # dense misaligned convolutions (a stem's 3 input channels) keep the half-peak tensor-core price
    assert uses_tensor_cores(a100, "fp16", "conv", False)


def test_bf16_convolutions_before_ampere_run_the_im2col_gemm_lowering() -> None:
    # Note [bf16 convolutions before Ampere]: below cc 8.0 torch runs a bf16 convolution as im2col + GEMM on CUDA
    # cores (no cuDNN, no Winograd, no tensor cores); it was priced 1.6x faster than the fp32 cuDNN one.
    from types import SimpleNamespace

    from gpemu.cost.model import kernel_seconds
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    v100, a100 = get_gpu("v100-pcie-32gb"), get_gpu("a100")  # V100: 14 TFLOPS fp32, 900 GB/s, no bf16 math
    shared = {**load_params().shared, "w_half": 0.0, "k0": 0.0, "mem_lat_cycles": 0.0, "e_conv": 2.0,
              "e_conv_bwd": 2.0, "e_conv_1x1": 0.5, "e_conv_1x1_bwd": 0.5, "m_conv": 0.2, "m_conv_bwd": 0.4,
              "m_elementwise": 0.5, "m_elementwise_bwd": 0.5}
    params = CostParams(shared, {}, tc_eff=0.7)  # no per-GPU factors: a = b = 1
    fp32, bf16 = OpCost(1.4e11, 3.6e8, "conv", "fp32"), OpCost(1.4e11, 1.8e8, "conv", "bf16", tensor_core=True)
    # fp32 3x3, cuDNN (Note [Staged convolutions]): 1.4e11 / (14e12 * 2.0) = 5 ms + 3.6e8 / (900e9 * 0.2) = 2 ms
    assert cost_time_s(fp32, "convolution", v100, params, out_channels=64) == pytest.approx(7e-3)
    # bf16 3x3, C_out 64: GEMM 1.4e11 / (14e12 * 0.5) = 20 ms; bytes 1.8e8 + columns 2 * 1.4e11 / 64 = 4.375e9,
    # 4.555e9 / (900e9 * 0.5) = 10.12 ms; staged: 30.12 ms (it read 5 + 1 = 6 ms, bytes halved, before)
    lowered_s = 20e-3 + (1.8e8 + 2 * 1.4e11 / 64) / (900e9 * 0.5)
    assert cost_time_s(bf16, "convolution", v100, params, out_channels=64) == pytest.approx(lowered_s)
    assert cost_time_s(bf16, "convolution_backward", v100, params, out_channels=64) == pytest.approx(lowered_s)
    # a 1x1 one has no column matrix: 20 ms + 1.8e8 / (900e9 * 0.5) = 0.4 ms
    assert cost_time_s(bf16, "convolution", v100, params, pointwise=True) == pytest.approx(20.4e-3)
    # an A100 runs it on cuDNN's bf16 tensor cores, untouched: compute 1.4e11 / (312e12 * 0.7) = 0.64 ms, and
    # 0.18 GB streamed in well under 1 ms; fp16 on the V100 keeps its tensor cores: 1.4e11 / (112e12 * 0.7)
    assert cost_time_s(bf16, "convolution", a100, params, out_channels=64) < 1e-3
    fp16 = OpCost(1.4e11, 1.8e8, "conv", "fp16", tensor_core=True)
    assert cost_time_s(fp16, "convolution", v100, params, out_channels=64) == pytest.approx(1.4e11 / (112e12 * 0.7))
    # the phase model (kernel_seconds over spec_columns) prices it the same way, C_out read from the weight
    recs = [SimpleNamespace(name="convolution", category="conv", phase="forward", flops=1.4e11, bytes=b, dtype=dt,
                            tensor_core=dt != "fp32", in_shapes=[(64, 32, 58, 58), (64, 32, 3, 3)])
            for b, dt in ((3.6e8, "fp32"), (1.8e8, "bf16"))]
    ops = op_arrays(recs)
    kern = kernel_seconds(ops.flops, ops.bytes, spec_columns(ops, v100, 0.7), shared, params.factors(v100))
    assert kern.tolist() == pytest.approx([7e-3, lowered_s])
    # the loop runs per sample: with a per-kernel cost k0 = 1 us, 64 samples launch 2 * 64 kernels forward (127
    # past the first: +127 us) and 4 * 64 backward (+255 us); the fp32 one stays one kernel (+1 us, its own k0)
    timed = CostParams({**shared, "k0": 1e-6}, {}, tc_eff=0.7)
    assert cost_time_s(bf16, "convolution", v100, timed, out_channels=64, samples=64) == pytest.approx(
        lowered_s + 128e-6)
    assert cost_time_s(bf16, "convolution_backward", v100, timed, out_channels=64, samples=64) == pytest.approx(
        lowered_s + 256e-6)
    assert cost_time_s(fp32, "convolution", v100, timed, out_channels=64, samples=64) == pytest.approx(7e-3 + 1e-6)
    assert ops.conv_batch is not None and ops.conv_batch.tolist() == [64.0, 64.0]  # read from the input's shape
    kern = kernel_seconds(ops.flops, ops.bytes, spec_columns(ops, v100, 0.7), timed.shared, params.factors(v100),
                          conv_batch=ops.conv_batch)
    assert kern.tolist() == pytest.approx([7e-3 + 1e-6, lowered_s + 128e-6])


def test_tensor_core_convolutions_take_the_gpu_factor_t_and_gemms_do_not() -> None:
    # Note [Tensor-core convolution factor]: a compute-bound fp16 convolution on tensor cores runs at
    # peak * tc_eff * t; a GEMM of the same FLOPs ignores t.
    from dataclasses import replace

    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    base = load_params()
    h100 = get_gpu("h100-sxm5-80gb")
    per_gpu = {**base.per_gpu, h100.key: {"a": 1.0, "b": 1.0, "c": 1.0, "t": 0.5}}
    halved = replace(base, per_gpu=per_gpu)
    unit = replace(base, per_gpu={**base.per_gpu, h100.key: {"a": 1.0, "b": 1.0, "c": 1.0, "t": 1.0}})
    p = base.shared
    # 256 x 256 x 3x3 on 128 x 56 x 56: 2 * 128*56*56 * 256*256*9 = 473.6 GFLOP, 0.64 ms at 989.5 TFLOPS x 0.75
    conv = OpCost(2 * 128 * 56 * 56 * 256 * 256 * 9, 3 * 128 * 256 * 56 * 56 * 2, "conv", "fp16", tensor_core=True)
    t1 = cost_time_s(conv, "convolution", h100, unit) - p["k0"]
    t_half = cost_time_s(conv, "convolution", h100, halved) - p["k0"]
    assert t_half == pytest.approx(2 * t1, rel=1e-9)
    gemm = OpCost(conv.flops, conv.bytes, "matmul", "fp16", tensor_core=True)
    assert cost_time_s(gemm, "mm", h100, halved) == pytest.approx(cost_time_s(gemm, "mm", h100, unit), rel=1e-12)


def test_an_unfitted_gpu_borrows_t_from_its_nearest_fitted_one() -> None:
    # Note [Borrowed factors]: the H100 has no rows of its own; it takes a, b and t of the nearest fitted GPU
    from dataclasses import replace

    base = load_params()
    fitted = replace(base, per_gpu={**base.per_gpu, "h200-sxm-141gb": {"a": 0.9, "b": 0.8, "c": 0.7, "t": 0.6}},
                     not_lent=frozenset())
    f = fitted.factors(get_gpu("h100-sxm5-80gb"))
    assert fitted.factor_source(get_gpu("h100-sxm5-80gb")) == "h200-sxm-141gb"
    assert (f["a"], f["b"], f["t"], f["c"]) == (0.9, 0.8, 0.6, 1.0)  # the host factor stays the average
    # a GPU fitted with --add-gpu serves itself only (Note [Fitting a newly measured GPU] in calibrate.py)
    own_only = replace(fitted, not_lent=frozenset({"h200-sxm-141gb"}))
    assert own_only.factor_source(get_gpu("h100-sxm5-80gb")) != "h200-sxm-141gb"
    assert own_only.factors(get_gpu("h200"))["t"] == 0.6


def test_attention_shape_scale_follows_the_h200_table() -> None:
    # Note [Attention kernels on Hopper]: 1 for a flash forward at head dim 128 without a mask; (64/128)^0.65 = 0.637
    # at head dim 64; x0.72 causal (FLOPs already halved), x0.72 backward, x0.5 memory-efficient backend.
    from gpemu.cost.model import attention_shape_scale

    q128, q64 = (2, 16, 4096, 128), (2, 16, 4096, 64)
    full128 = 4 * 2 * 16 * 4096 * 4096 * 128  # 2 * B*H*S*S*D for Q K^T plus the same for P V
    full64 = full128 / 2
    fwd = "_scaled_dot_product_flash_attention"
    assert attention_shape_scale(fwd, [q128, q128, q128], full128) == pytest.approx(1.0)
    assert attention_shape_scale(fwd, [q64, q64, q64], full64) == pytest.approx(0.5**0.65)
    assert attention_shape_scale(fwd, [q64, q64, q64], full64 / 2) == pytest.approx(0.5**0.65 * 0.72)  # causal
    bwd = "_scaled_dot_product_flash_attention_backward"  # inputs: grad_out, q, k, v, out, logsumexp
    assert attention_shape_scale(bwd, [q128, q128, q128, q128, q128], 2.5 * full128) == pytest.approx(0.72)
    eff = "_scaled_dot_product_efficient_attention"
    assert attention_shape_scale(eff, [q128, q128, q128], full128) == pytest.approx(0.5)


def test_attention_scale_applies_on_hopper_only() -> None:
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    params = load_params()
    k0 = params.shared["k0"]
    # 2.2 TFLOP of attention: compute-bound on both GPUs
    attn = OpCost(2.2e12, 1e8, "attention", "bf16", tensor_core=True)
    for gpu, expected in (("h100-sxm5-80gb", 2.0), ("a100-sxm4-80gb", 1.0)):
        spec = get_gpu(gpu)
        whole = cost_time_s(attn, "_scaled_dot_product_flash_attention", spec, params) - k0
        half = cost_time_s(attn, "_scaled_dot_product_flash_attention", spec, params, attn_scale=0.5) - k0
        assert half / whole == pytest.approx(expected, rel=1e-6)


def test_hopper_16_bit_nchw_convolutions_pay_their_transposes() -> None:
    # Note [NCHW convolutions on Hopper]: an fp16 NCHW forward transposes x and y on cc 9.x, none on an A100
    # (Note [NCHW forward on cuDNN 9]); TF32 stays layout-neutral on both; the backward transposes dy, x, dx on both.
    from gpemu.cost.model import LAYOUT_NCHW, transposed_tensors

    h100, a100 = get_gpu("h100-sxm5-80gb"), get_gpu("a100-sxm4-80gb")
    assert transposed_tensors(h100, "fp16", True, LAYOUT_NCHW, backward=False) == 2
    assert transposed_tensors(a100, "fp16", True, LAYOUT_NCHW, backward=False) == 0
    assert transposed_tensors(h100, "fp32", True, LAYOUT_NCHW, backward=False) == 0
    assert transposed_tensors(h100, "fp16", True, LAYOUT_NCHW, backward=True) == 3


def test_hopper_fp32_gemms_are_priced_at_three_quarters_of_peak() -> None:
    # Note [FP32 GEMMs on Hopper]: an IEEE fp32 GEMM's CUDA-core peak is 67 TFLOPS x 0.75 / 0.9 on an H100, so with
    # e_matmul's 0.9 it runs at 0.75 of the datasheet; a convolution keeps the full fp32 peak, and an A100 too.
    from gpemu.cost.model import peak_flops

    h100, a100 = get_gpu("h100-sxm5-80gb"), get_gpu("a100-sxm4-80gb")
    ratio = h100.load_clock_ratio
    assert peak_flops(h100, "fp32", "matmul", False) == pytest.approx(67e12 * 0.75 / 0.9 * ratio, rel=0.01)
    assert peak_flops(h100, "fp32_ieee", "conv", False) == pytest.approx(67e12 * ratio, rel=0.01)  # TF32 off
    assert peak_flops(a100, "fp32", "matmul", False) == pytest.approx(19.5e12 * a100.load_clock_ratio, rel=0.01)


def test_layer_norm_memory_efficiency_ramps_with_its_row_length() -> None:
    # Note [Layer-norm row length]: R / (R + 590); ViT-B/16's rows of 768: 0.566; ConvNeXt's first stage (96): 0.140
    from gpemu.cost.model import layer_norm_row_ramp
    from gpemu.cost.registry import OpCost
    from gpemu.cost.roofline import cost_time_s

    assert layer_norm_row_ramp("native_layer_norm", (64, 197, 768)) == pytest.approx(768 / 1358)
    assert layer_norm_row_ramp("native_layer_norm_backward", (64, 56, 56, 96)) == pytest.approx(96 / 686)
    assert layer_norm_row_ramp("native_batch_norm", (64, 256, 56, 56)) == 1.0
    params = load_params()
    h200 = get_gpu("h200")
    ln = OpCost(5 * 64 * 197 * 768, 2 * 64 * 197 * 768 * 4, "norm", "fp32")  # 77.5 MB through: memory-bound
    long_row = cost_time_s(ln, "native_layer_norm", h200, params)
    short_row = cost_time_s(ln, "native_layer_norm", h200, params, row_ramp=0.14)
    assert short_row > 3 * long_row  # the same bytes in 96-element rows: the card ran them 3.7x slower per byte


def test_nchw_training_batch_norm_runs_one_block_per_channel() -> None:
    # Note [Batch norm, one block per channel]: ResNet-50's first batch norm at batch 64 (64 channels of 112 x 112)
    # takes at least N*H*W / (0.8 elements per cycle * clock) + latency: 64 * 12544 = 802,816 elements; on an H200
    # at 1,980 MHz that is 802816 / (0.8 * 1.98e9) = 506.8 us, whatever the dtype (the card: 588 us fp16, 460 fp32).
    # Its bytes alone (3 passes of 102.8 MB in fp16) would stream in ~80 us at m_stream of 4.8 TB/s.
    from gpemu.cost.model import (
        BN_CHANNEL_ELEMS_PER_CYCLE,
        BN_CHANNEL_ELEMS_PER_CYCLE_BWD,
        channel_elems_per_byte,
        past_single_read,
    )
    from gpemu.cost.registry import op_cost
    from gpemu.cost.roofline import op_time_s

    aten = torch.ops.aten
    h200 = get_gpu("h200")
    params = load_params()
    latency_s = params.shared["mem_lat_cycles"] / 1.98e9
    w = torch.empty(64, device="meta")
    bn = aten.native_batch_norm.default
    for dtype in (torch.float16, torch.float32):
        x = torch.empty(64, 64, 112, 112, dtype=dtype, device="meta")
        args = (x, w, w, w, w, True, 0.1, 1e-5)
        out = bn(*args)
        assert op_cost(bn, args, {}, out).channel_elems == 64 * 112 * 112
        floor_s = 64 * 12544 / (BN_CHANNEL_ELEMS_PER_CYCLE * 1.98e9) + latency_s
        assert op_time_s(bn, args, {}, out, h200) == pytest.approx(floor_s + params.shared["k0"], rel=1e-6)
        # the backward: 0.35 elements per cycle, 802816 / (0.35 * 1.98e9) = 1158.5 us
        bwd = aten.native_batch_norm_backward.default
        bargs = (x, x, w, w, w, w, w, True, 1e-5, [True, True, True])
        bout = bwd(*bargs)
        floor_bwd_s = 64 * 12544 / (BN_CHANNEL_ELEMS_PER_CYCLE_BWD * 1.98e9) + latency_s
        assert op_time_s(bwd, bargs, {}, bout, h200) == pytest.approx(floor_bwd_s + params.shared["k0"], rel=1e-6)
    # no floor: eval mode (no reduction), channels_last (other kernels), a channel that fits the single-read kernel
    # (resnet50's last stage at batch 64: 64 * 7 * 7 = 3,136 elements, 6 KB in fp16)
    x = torch.empty(64, 64, 112, 112, dtype=torch.float16, device="meta")
    eval_args = (x, w, w, w, w, False, 0.1, 1e-5)
    assert op_cost(bn, eval_args, {}, bn(*eval_args)).channel_elems == 0
    xcl = x.contiguous(memory_format=torch.channels_last)
    cl_args = (xcl, w, w, w, w, True, 0.1, 1e-5)
    assert op_cost(bn, cl_args, {}, bn(*cl_args)).channel_elems == 0
    assert not past_single_read(64 * 7 * 7, "fp16")
    assert past_single_read(64 * 56 * 56, "fp16")  # layer1 at batch 64: 200,704 elements, 392 KB
    assert not past_single_read(16 * 56 * 56, "fp16")  # ... at batch 16: 50,176 elements, 98 KB (the card: 3x faster)
    # the per-byte figure is batch-independent: N*H*W / (3 * N*C*H*W * 2) = 1 / (6 C)
    assert channel_elems_per_byte(64 * 3136, 3 * 64 * 256 * 3136 * 2) == pytest.approx(1 / (6 * 256))


def test_misaligned_gemms_on_hopper_price_by_alignment() -> None:
    # Note [Misaligned GEMMs on Hopper]: GPT-2's LM head, (8192 x 768) @ (768 x 50257) in fp16, is 2 * 8192 * 768 *
    # 50257 = 632.4 GFLOP. On an H200 (989.4 TFLOP/s fp16 dense) with its odd N it runs at 0.17 x tc_eff (0.75) = 0.13
    # of the peak, ~126 TFLOP/s: ~5.0 ms (the card: 6.3 ms forward, 4.3-4.5 ms for the backward's two); BERT-base's
    # even 30522 at 0.33 x 0.75 = 0.25 of it (~245 TFLOP/s: 384.2 GFLOP in ~1.57 ms; the card: 1.50-1.61 ms). An A100
    # keeps Note [Misaligned GEMMs]'s half peak for both.
    from gpemu.cost.model import (
        HOPPER_MISALIGNED_EVEN,
        HOPPER_MISALIGNED_ODD,
        MISALIGNED_TC_FRACTION,
        peak_flops,
    )
    from gpemu.cost.registry import gemm_alignment, op_cost

    assert (gemm_alignment(768, 50257), gemm_alignment(768, 30522), gemm_alignment(768, 3072)) == (1, 2, 8)
    assert gemm_alignment(8192, 50257) == 1 and gemm_alignment(1024, 1020) == 4
    aten = torch.ops.aten
    a = torch.empty(8192, 768, dtype=torch.float16, device="meta")
    b = torch.empty(768, 50257, dtype=torch.float16, device="meta")
    cost = op_cost(aten.mm.default, (a, b), {}, aten.mm(a, b))
    assert (cost.tensor_core, cost.gemm_align, cost.flops) == (False, 1, 2 * 8192 * 768 * 50257)
    h200, a100 = get_gpu("h200"), get_gpu("a100")
    fp16_peak = h200.peak_tflops["fp16"] * 1e12 * h200.load_clock_ratio
    assert peak_flops(h200, "fp16", "matmul", False, 1) == pytest.approx(fp16_peak * HOPPER_MISALIGNED_ODD)
    assert peak_flops(h200, "fp16", "matmul", False, 2) == pytest.approx(fp16_peak * HOPPER_MISALIGNED_EVEN)
    # rows M alone misaligned (K and N aligned): the fallback of Note [Misaligned GEMMs]
    assert peak_flops(h200, "fp16", "matmul", False, 8) == pytest.approx(fp16_peak * MISALIGNED_TC_FRACTION)
    a100_peak = a100.peak_tflops["fp16"] * 1e12 * a100.load_clock_ratio
    assert peak_flops(a100, "fp16", "matmul", False, 1) == pytest.approx(a100_peak * MISALIGNED_TC_FRACTION)
    t = op_time_s_of(aten.mm.default, (a, b), h200)
    assert 4.0e-3 < t < 6.0e-3  # 632.4e9 / (989.4e12 * 0.17 * 0.75) = 5.01 ms, plus the fill ramp


def op_time_s_of(func: Any, args: tuple[Any, ...], gpu: Any) -> float:
    """Return the roofline's kernel seconds of one aten op on meta tensors."""
    from gpemu.cost.roofline import op_time_s

    return op_time_s(func, args, {}, func(*args), gpu)


def test_layer_norm_row_half_scales_with_bandwidth_per_sm_cycle() -> None:
    # Note [Layer-norm row length]: half-way at 590 elements on the H200 (4.8 TB/s / (132 SMs x 1.98 GHz) = 18.37
    # B/cycle/SM); an RTX 4090's forward: 1008 GB/s / (128 x 2.52 GHz) = 3.125 B/cycle/SM -> 590 x 3.125 / 18.37 = 100.4
    # (its sustained clock as the catalog prices it); the backward keeps the H200's 590 everywhere
    from gpemu.cost.model import layer_norm_row_half, layer_norm_row_ramp

    h200, rtx4090 = get_gpu("h200"), get_gpu("rtx4090")
    assert layer_norm_row_half(h200) == pytest.approx(590.0)
    per_sm_cycle = rtx4090.load_memory_bw_gbps * 1e9 / (rtx4090.sm_count * rtx4090.load_clock_mhz * 1e6)
    assert layer_norm_row_half(rtx4090) == pytest.approx(590.0 * per_sm_cycle / (4.8e12 / (132 * 1.98e9)))
    assert 90 < layer_norm_row_half(rtx4090) < 110
    vit_row = (64, 197, 192)  # vit_tiny: rows of 192
    assert layer_norm_row_ramp("native_layer_norm", vit_row, rtx4090) == pytest.approx(
        192 / (192 + layer_norm_row_half(rtx4090)))
    assert layer_norm_row_ramp("native_layer_norm_backward", vit_row, rtx4090) == pytest.approx(192 / (192 + 590))
