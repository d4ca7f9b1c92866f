"""Tests for the GPU catalog: every entry loads, names resolve, figures are sane and cited."""

from __future__ import annotations

import pytest

from gpemu.errors import UnknownNameError
from gpemu.hardware import GPUSpec, get_gpu, gpu_names, list_gpus
from gpemu.hardware.spec import DTYPE_KEYS

REQUIRED_KEYS = [
    "k80", "m40", "p100-pcie-16gb", "v100-pcie-32gb", "v100-sxm2-32gb", "t4", "quadro-rtx-6000", "a10",
    "a100-pcie-40gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "l4", "l40s", "h100-sxm5-80gb", "h100-pcie-80gb",
    "h200-sxm-141gb", "b200",
]  # fmt: skip

# (name a user or tool would type, expected key): GPEmu folder names and torch.cuda.get_device_name() strings.
ALIASES = [
    ("Tesla_K80", "k80"),
    ("Tesla K80", "k80"),
    ("Tesla_M40", "m40"),
    ("Tesla_P100-PCIE-16GB", "p100-pcie-16gb"),
    ("Tesla P100-PCIE-16GB", "p100-pcie-16gb"),
    ("Tesla_V100-PCIE-32GB", "v100-pcie-32gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Quadro_RTX_6000", "quadro-rtx-6000"),
    ("Quadro RTX 6000", "quadro-rtx-6000"),
    ("Tesla T4", "t4"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("NVIDIA B200", "b200"),
    ("v100", "v100-pcie-32gb"),
    ("a100", "a100-sxm4-80gb"),
    ("h100", "h100-sxm5-80gb"),
]


def test_every_required_gpu_is_in_the_catalog() -> None:
    keys = [s.key for s in list_gpus()]
    assert sorted(set(REQUIRED_KEYS) - set(keys)) == []
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("name", "key"), ALIASES)
def test_aliases_resolve(name: str, key: str) -> None:
    assert get_gpu(name).key == key


def test_names_are_unambiguous() -> None:
    # Two GPUs sharing an alias would make get_gpu answer whichever came first: forbid it.
    seen: dict[str, str] = {}
    for spec in list_gpus():
        for name in {spec.key, spec.name, *spec.aliases}:
            norm = "".join(ch for ch in name.lower() if ch.isalnum())
            assert seen.setdefault(norm, spec.key) == spec.key, f"{name!r} names {seen[norm]} and {spec.key}"
    assert len(gpu_names()) >= len(list_gpus()) * 3


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_gpu("v1000")
    assert "v100" in str(info.value)
    with pytest.raises(UnknownNameError) as info:
        get_gpu("Tesla_K8O")
    assert "Tesla_K80" in str(info.value)


@pytest.mark.parametrize("spec", list_gpus(), ids=lambda s: s.key)
def test_figures_are_sane_and_cited(spec: GPUSpec) -> None:
    assert set(spec.peak_tflops) == set(DTYPE_KEYS)
    assert spec.peak_tflops["fp32"] > 0 and spec.memory_gib > 0 and spec.memory_bw_gbps > 0 and spec.sm_count > 0
    if spec.compute_capability >= (7, 0):  # tensor cores from Volta on: fp16 well above fp32 (Ada: 362 / 91.6)
        assert spec.peak_tflops["fp16"] >= 3.5 * spec.peak_tflops["fp32"]
    if spec.compute_capability >= (8, 0):  # TF32 and BF16 from Ampere on
        assert spec.peak_tflops["fp32"] <= spec.peak_tflops["tf32"] <= spec.peak_tflops["fp16"]
        assert spec.peak_tflops["bf16"] == spec.peak_tflops["fp16"]
    assert spec.peak_tflops["fp64"] <= spec.peak_tflops["fp32"]
    # Pageable copies go through a host bounce buffer: never faster than pinned, which never beats the link.
    link_gbps = {3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}[spec.pcie_gen]  # x16 payload rate per generation
    assert 0 < spec.h2d_pageable_gbps <= spec.h2d_pinned_gbps < link_gbps
    assert 0 < spec.launch_overhead_us < 20 and 0 < spec.context_mib < 2000
    for figure in ("peak_tflops", "memory_bw_gbps", "h2d_pinned_gbps", "h2d_pageable_gbps"):
        assert spec.sources.get(figure), f"{spec.key}: no source cited for {figure}"


def test_k80_is_one_die_as_cuda_sees_it() -> None:
    k80 = get_gpu("Tesla_K80")
    # Board: 8.73 TFLOPS FP32, 24 GB, 480 GB/s for two GK210 dies -> 4.37, 12, 240 per die.
    assert k80.peak_tflops["fp32"] == pytest.approx(8.73 / 2, abs=0.01)
    assert k80.memory_gib == 12.0
    assert k80.memory_bw_gbps == 240.0


def test_k80_under_load_runs_at_its_base_clock() -> None:
    # Note [Sustained clock]: 562 MHz base clock; full bandwidth needs ~705 MHz.
    k80 = get_gpu("k80")
    assert k80.load_clock_mhz == 562.0
    assert k80.load_clock_ratio == pytest.approx(562 / 875)  # 0.642
    assert k80.load_memory_bw_gbps == pytest.approx(240 * 562 / 705)  # 191.3 GB/s
    for figure in ("sustained_clock_mhz", "full_bandwidth_clock_mhz"):
        assert k80.sources.get(figure), figure


def test_gpus_without_a_sustained_clock_run_at_boost() -> None:
    for spec in list_gpus():
        if spec.key == "k80":
            continue
        assert spec.load_clock_mhz == spec.boost_clock_mhz, spec.key
        assert spec.load_memory_bw_gbps == spec.memory_bw_gbps, spec.key


def test_pageable_h2d_matches_gpemu_measurements(shared_data) -> None:
    import pandas as pd

    rows = pd.read_csv(shared_data / "gpemu-profiles" / "ROWS.csv")
    h2d = rows[(rows["kind"] == "h2d_pageable") & (rows["measured"] == 1) & (rows["batch_size"] >= 128)]
    gbps = h2d["batch_size"] * 3 * 224 * 224 * 4 / h2d["value"] / 1e9  # bytes of one fp32 input batch / seconds
    for folder, measured in gbps.groupby(h2d["gpu"]).median().items():
        assert get_gpu(str(folder)).h2d_pageable_gbps == pytest.approx(measured, rel=0.03), folder
