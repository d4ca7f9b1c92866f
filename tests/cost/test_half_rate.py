"""GeForce tensor cores at half rate: Note [Half-rate tensor cores] in gpemu/cost/model.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpemu.cost.model import load_params
from gpemu.cost.registry import OpCost
from gpemu.cost.roofline import cost_time_s
from gpemu.hardware import get_gpu

N = 8192
GEMM = OpCost(2 * N**3, 3 * N * N * 2, "matmul", "fp16", tensor_core=True)  # 1.0995e12 FLOP, three fp16 matrices


def test_half_rate_boards_are_the_geforce_ones() -> None:
    # the same SM on both sides of each pair: GA102, AD102, GB202
    assert [get_gpu(k).half_rate_tensor for k in ("rtx3090", "rtx4090", "rtx5090")] == [True] * 3
    assert [get_gpu(k).half_rate_tensor for k in ("rtx-a6000", "rtx6000-ada", "rtx-pro-6000-maxq", "a100")] == [False] * 4


def test_a_large_gemm_reaches_the_half_rate_efficiency() -> None:
    params = load_params()
    assert params.tc_eff_half_rate > 1.0 > params.tc_eff  # fitted: 4090 GEMMs above the datasheet, others ~3/4
    t = cost_time_s(GEMM, "mm", get_gpu("rtx4090"), params)
    # 1.0995e12 FLOP at 165.2 TFLOPS x tc_eff_half_rate (1.0414: 172.0 TFLOPS) = 6.39 ms; the ramp and the latency
    # add < 1 %
    assert GEMM.flops / t / 1e12 == pytest.approx(165.2 * params.tc_eff_half_rate, rel=0.01)
    t_ada = cost_time_s(GEMM, "mm", get_gpu("rtx6000-ada"), params)  # full rate: 364.2 x tc_eff
    assert GEMM.flops / t_ada / 1e12 == pytest.approx(364.2 * params.tc_eff, rel=0.01)


def test_without_a_half_rate_fit_every_gpu_takes_tc_eff() -> None:
    params = replace(load_params(), tc_eff_half_rate=0.0)
    assert params.tc_eff_for(get_gpu("rtx4090")) == params.tc_eff
