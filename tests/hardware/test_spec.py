"""Tests for the GPU catalog: every entry loads, names resolve, figures are sane and cited."""

from __future__ import annotations

import pytest

from gpemu.errors import UnknownNameError
from gpemu.hardware import GPUSpec, get_gpu, gpu_names, list_gpus
from gpemu.hardware.spec import DTYPE_KEYS

REQUIRED_KEYS = [
    "k80", "m40", "p100-pcie-16gb", "v100-pcie-32gb", "v100-sxm2-32gb", "t4", "quadro-rtx-6000", "a10",
    "a100-pcie-40gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-80gb", "l4", "l40s", "h100-sxm5-80gb", "h100-pcie-80gb",
    "h200-sxm-141gb", "b200", "rtx3090", "rtx4090", "rtx-a6000", "a40", "a30", "l40", "rtx6000-ada",
    "rtx5090", "rtx-pro-6000-maxq",
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
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA A30", "a30"),
    ("NVIDIA L40", "l40"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000-maxq"),
    ("v100", "v100-pcie-32gb"),
    ("a100", "a100-sxm4-80gb"),
    ("h100", "h100-sxm5-80gb"),
    ("3090", "rtx3090"),
    ("rtx4090", "rtx4090"),
    ("a6000", "rtx-a6000"),
    ("RTX-6000-Ada", "rtx6000-ada"),
    ("rtx6000", "quadro-rtx-6000"),  # the Turing Quadro keeps its short name; the Ada board is rtx6000-ada
    ("l40", "l40"),
    ("l40s", "l40s"),
    ("5090", "rtx5090"),
    ("pro6000maxq", "rtx-pro-6000-maxq"),  # timm's results/ file tag
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
    if spec.compute_capability in ((8, 6), (8, 9), (12, 0)):
        # GA10x/AD10x/GB20x doubled the FP32 CUDA cores, and GeForce boards and the L40 run FP16 tensor math with FP32
        # accumulate at half rate (Note [FP32-accumulate tensor rate] in gpus.toml): only 2x fp32 there
        # (RTX 3090: 71 / 35.6 = 1.99; L40: 181.05 / 90.5 = 2.0; RTX 5090: 209.5 / 104.8 = 2.0; RTX 6000 Ada:
        # 364.2 / 91.1 = 4.0).
        assert spec.peak_tflops["fp16"] >= 1.9 * spec.peak_tflops["fp32"]
    elif spec.compute_capability >= (7, 0):  # tensor cores from Volta on: fp16 well above fp32 (A100: 312 / 19.5)
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


def test_geforce_boards_use_the_fp32_accumulate_tensor_rate() -> None:
    # PyTorch's cuBLAS/cuDNN GEMMs accumulate in FP32; GeForce boards run that at half their FP16-accumulate rate.
    rtx3090 = get_gpu("NVIDIA GeForce RTX 3090")
    assert rtx3090.peak_tflops["fp16"] == pytest.approx(142 / 2)  # GA102 whitepaper: 142 FP16-acc, 71 FP32-acc
    assert rtx3090.peak_tflops["fp32"] == pytest.approx(10496 * 2 * 1.695e9 / 1e12, abs=0.05)  # 35.58
    rtx4090 = get_gpu("rtx4090")
    assert rtx4090.peak_tflops["fp16"] == pytest.approx(330.3 / 2, abs=0.06)  # Ada whitepaper: 330.3 / 165.2
    assert rtx4090.peak_tflops["fp32"] == pytest.approx(16384 * 2 * 2.52e9 / 1e12, abs=0.05)  # 82.58
    assert rtx4090.peak_tflops["fp16"] < get_gpu("l40s").peak_tflops["fp16"] / 2  # 165.2 < 362.05 / 2 = 181.0


def test_professional_boards_run_fp32_accumulate_at_full_rate() -> None:
    # Datasheet sparse figures halved: A6000 309.7 / 2 = 154.8; A40 299.4 / 2 = 149.7; RTX 6000 Ada FP8
    # 1457 / 2 / 2 = 364.2 (= 142 SMs x 1024 FLOP/clk x 2.505 GHz). 4x fp32 on these boards, against 2x on GeForce.
    for name, fp16, fp32 in (("a6000", 154.8, 38.7), ("a40", 149.7, 37.4), ("rtx6000-ada", 364.2, 91.1)):
        spec = get_gpu(name)
        assert spec.peak_tflops["fp16"] == pytest.approx(fp16, abs=0.1), name
        assert spec.peak_tflops["bf16"] == spec.peak_tflops["fp16"], name
        assert spec.peak_tflops["fp16"] == pytest.approx(4 * fp32, rel=0.01), name
    assert get_gpu("rtx6000-ada").peak_tflops["fp16"] == pytest.approx(142 * 1024 * 2.505e9 / 1e12, rel=0.001)


def test_new_boards_key_figures_match_their_datasheets() -> None:
    rtx3090 = get_gpu("3090")
    assert (rtx3090.sm_count, rtx3090.compute_capability, rtx3090.memory_bw_gbps) == (82, (8, 6), 936.0)
    assert rtx3090.memory_bytes == 24269 * 1024**2  # OOM messages '23.70 GiB total capacity': 23.70 x 1024
    assert rtx3090.nvlink_gbps == 112.5 / 2  # NVLink bridge 112.5 GB/s bidirectional
    rtx4090 = get_gpu("rtx4090")
    assert (rtx4090.sm_count, rtx4090.compute_capability, rtx4090.l2_cache_mib) == (128, (8, 9), 72.0)
    assert rtx4090.nvlink_gbps == 0.0
    a30 = get_gpu("NVIDIA A30")
    assert (a30.compute_capability, a30.memory_bw_gbps, a30.peak_tflops["fp64"]) == ((8, 0), 933.0, 5.2)  # GA100
    l40 = get_gpu("NVIDIA L40")
    # Datasheet 90.5 FP32 TFLOPS = 18176 cores x 2 x 2.49 GHz; its tensor rate is half the L40S's.
    assert l40.peak_tflops["fp32"] == pytest.approx(18176 * 2 * l40.boost_clock_mhz * 1e6 / 1e12, abs=0.05)
    assert l40.peak_tflops["fp16"] == 181.05 and l40.sm_count == get_gpu("l40s").sm_count == 142
    for spec in (rtx3090, rtx4090, a30, l40, get_gpu("a40"), get_gpu("rtx6000-ada")):
        # CUDA reports less than the marketing GiB (ECC / driver reservations).
        assert 0.9 * spec.memory_gib * 1024 < spec.total_memory_mib < spec.memory_gib * 1024, spec.key
        assert spec.sources.get("total_memory_mib") and spec.sources.get("sm_count"), spec.key


def test_blackwell_rtx_boards_match_their_per_sm_clock_rates() -> None:
    # GB202: 128 FP32 lanes and 1024 dense FP16 tensor FLOP/clk per SM (FP16 accumulate).
    rtx5090 = get_gpu("NVIDIA GeForce RTX 5090")
    assert (rtx5090.arch, rtx5090.compute_capability, rtx5090.sm_count) == ("blackwell", (12, 0), 170)
    assert rtx5090.peak_tflops["fp32"] == pytest.approx(170 * 128 * 2 * 2.407e9 / 1e12, abs=0.05)  # 104.75
    # GeForce: FP32 accumulate at half the FP16-accumulate rate, 170 x 1024 x 2.407 GHz / 2 = 209.5
    assert rtx5090.peak_tflops["fp16"] == pytest.approx(170 * 1024 * 2.407e9 / 2 / 1e12, abs=0.05)
    assert rtx5090.peak_tflops["fp16"] == pytest.approx(2 * rtx5090.peak_tflops["fp32"], rel=0.01)
    assert rtx5090.memory_bw_gbps == 28 * 512 / 8  # 28 Gbps GDDR7 x 512 bit = 1792 GB/s
    assert rtx5090.memory_bytes == 32113 * 1024**2  # OOM messages '31.36 GiB total capacity': 31.36 x 1024
    assert (rtx5090.l2_cache_mib, rtx5090.pcie_gen, rtx5090.nvlink_gbps) == (96.0, 5, 0.0)
    maxq = get_gpu("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition")
    assert (maxq.arch, maxq.compute_capability, maxq.sm_count, maxq.tdp_w) == ("blackwell", (12, 0), 188, 300.0)
    assert maxq.peak_tflops["fp32"] == pytest.approx(188 * 128 * 2 * 2.288e9 / 1e12, abs=0.05)  # 110.1
    # professional board: FP32 accumulate at the full rate, 188 x 1024 x 2.288 GHz = 440.5 = 4x fp32
    assert maxq.peak_tflops["fp16"] == pytest.approx(188 * 1024 * 2.288e9 / 1e12, abs=0.05)
    assert maxq.peak_tflops["fp16"] == pytest.approx(4 * maxq.peak_tflops["fp32"], rel=0.01)
    assert (maxq.memory_gib, maxq.memory_bw_gbps, maxq.l2_cache_mib) == (96.0, 1792.0, 128.0)
    for spec in (rtx5090, maxq):
        for figure in ("sm_count", "boost_clock_mhz", "l2_cache_mib", "tdp_w", "total_memory_mib", "memory_gib"):
            assert spec.sources.get(figure), (spec.key, figure)


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
