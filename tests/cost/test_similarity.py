"""Tests for gpemu.cost.similarity: generation-first ranking of source GPUs and borrowed per-GPU factors."""

from __future__ import annotations

import pytest

from gpemu.cost.model import CostParams
from gpemu.cost.predict import borrow_factors
from gpemu.cost.similarity import arch_generation, nearest, source_distance, spec_distance
from gpemu.hardware import get_gpu

FIVE = ["k80", "m40", "p100-pcie-16gb", "quadro-rtx-6000", "v100-pcie-32gb"]


def test_arch_generation_is_the_compute_capability() -> None:
    assert arch_generation(get_gpu("quadro-rtx-6000")) == pytest.approx(7.5)  # sm_75
    assert arch_generation(get_gpu("k80")) == pytest.approx(3.7)  # sm_37


def test_blackwell_rtx_ranks_right_after_ada() -> None:
    # Note [Blackwell RTX SM]: sm_120 keeps Ada's mma.sync tensor path; 8.9 + (0 + 1) / 100 = 8.91, not 12.0
    rtx5090 = get_gpu("rtx5090")
    assert arch_generation(rtx5090) == pytest.approx(8.91)
    assert arch_generation(get_gpu("rtx-pro-6000-maxq")) == pytest.approx(8.91)
    assert arch_generation(get_gpu("b200")) == pytest.approx(10.0)  # datacenter Blackwell keeps its number
    # the RTX 4090 is 0.01 away, the H100 0.09, the B200 1.09 (with 12.0 the B200 would have been first: 2.0 < 3.1)
    assert nearest(rtx5090, ["b200", "h100-sxm5-80gb", "rtx4090"]) == "rtx4090"
    assert nearest(rtx5090, ["b200", "h100-sxm5-80gb"]) == "h100-sxm5-80gb"
    assert nearest(get_gpu("b200"), ["rtx5090", "h100-sxm5-80gb"]) == "h100-sxm5-80gb"  # 1.0 < 1.09


def test_generation_outranks_spec_similarity() -> None:
    m40 = get_gpu("m40")
    # by spec alone the K80 die is closer to the M40 than the P100 is:
    # K80 |ln(6.84/4.37)| + |ln(288/240)| + 0.5|ln(24/13)| = 0.448 + 0.182 + 0.307 = 0.937
    # P100 |ln(9.3/6.84)| + |ln(732/288)| + 0.5|ln(56/24)| = 0.307 + 0.933 + 0.424 = 1.664
    assert spec_distance(m40, get_gpu("k80")) < spec_distance(m40, get_gpu("p100-pcie-16gb"))
    # but Pascal (6.0) is 0.8 generations from Maxwell (5.2) and Kepler (3.7) 1.5: the P100 is the better proxy
    assert source_distance(m40, get_gpu("p100-pcie-16gb")) == pytest.approx(0.8 + 0.1 * 1.664, abs=0.01)
    assert nearest(m40, FIVE) == "p100-pcie-16gb"
    assert nearest(get_gpu("p100-pcie-16gb"), FIVE) == "m40"  # 0.8 away; V100 is 1.0 away
    assert nearest(get_gpu("v100-pcie-32gb"), FIVE) == "quadro-rtx-6000"
    assert nearest(get_gpu("t4"), FIVE) == "quadro-rtx-6000"  # same Turing generation
    assert nearest(get_gpu("k80"), ["k80"]) is None  # a GPU is never its own proxy


def test_unfitted_gpu_borrows_the_nearest_fitted_factors() -> None:
    params = CostParams({}, {"v100-pcie-32gb": {"a": 1.1, "b": 1.2, "c": 0.9}, "k80": {"a": 0.8, "b": 0.7, "c": 1.1}})
    a100 = get_gpu("a100")
    assert params.factor_source(a100) == "v100-pcie-32gb"  # sm_80 is 1.0 from sm_70, 4.3 from sm_37
    # the device factors a, b come from the V100; the host factor c belongs to the machine that measured the V100,
    # so the A100 gets the fleet-average host 1.0 (Note [Borrowed factors])
    assert params.factors(a100) == {"a": 1.1, "b": 1.2, "c": 1.0, "t": 1.0}
    assert params.factors(get_gpu("k80"))["a"] == 0.8  # a fitted GPU keeps its own
    assert params.factors(a100, use_per_gpu=False) == {"a": 1.0, "b": 1.0, "c": 1.0, "t": 1.0}
    assert CostParams({}).factors(a100) == {"a": 1.0, "b": 1.0, "c": 1.0, "t": 1.0}  # nothing fitted: the fleet prior


def test_borrow_factors_takes_device_factors_only() -> None:
    params = CostParams({}, {"v100-pcie-32gb": {"a": 1.1, "b": 1.2, "c": 0.9}})
    borrowed = borrow_factors(params, "quadro-rtx-6000", "v100-pcie-32gb")
    assert borrowed.per_gpu["quadro-rtx-6000"] == {"a": 1.1, "b": 1.2}
    assert borrowed.factors(get_gpu("quadro-rtx-6000")) == {"a": 1.1, "b": 1.2, "c": 1.0, "t": 1.0}
    assert borrowed.per_gpu["v100-pcie-32gb"]["c"] == 0.9  # the source keeps its own host factor
