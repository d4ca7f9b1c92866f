"""Tests for gpemu.cost.model: the packaged fitted constants, effective peaks and the async phase formula."""

from __future__ import annotations

import math

import torch

from gpemu.cost.model import SHARED_PARAMS, load_params, peak_flops, phase_seconds
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
    # fp32 conv on Ampere uses TF32 tensor cores: 156e12 * 0.5 = 78e12 > 19.5e12 CUDA-core fp32
    assert peak_flops(a100, "fp32", "conv", False, 0.5) == 78e12
    assert peak_flops(a100, "fp32", "matmul", False, 0.5) == 19.5e12  # cuBLAS keeps fp32 off TF32 by default
    assert peak_flops(v100, "fp16", "matmul", True, 0.5) == 56e12  # 112e12 tensor-core peak * 0.5
    assert peak_flops(v100, "fp16", "matmul", False, 0.5) == 14e12  # misaligned 16-bit: CUDA cores
    assert peak_flops(p100, "fp16", "conv", True, 0.5) == 18.7e12  # no tensor cores: packed half2
    assert peak_flops(v100, "bf16", "matmul", True, 0.5) == 14e12  # no native bf16 before Ampere
