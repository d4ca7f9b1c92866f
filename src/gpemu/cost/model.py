"""The fitted time model: per-op kernel seconds from FLOPs/bytes and a GPU spec, and whole-phase seconds."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import torch

from gpemu.cost.registry import CATEGORIES, COMPUTE_CATEGORIES
from gpemu.cost.similarity import nearest
from gpemu.hardware import GPUSpec

# Note [Time model]
# One kernel of category c with F FLOPs and M bytes on GPU g:
#     compute_s = (F + w_half * sm_count) / (peak_g(dtype, c, tensor_core) * e_c * a_g)
#     memory_s  = M / (bw_g * m_c * r_bn * b_g) + mem_lat_cycles / clock_g   (r_bn: Note [Batch-norm plane size])
#     kernel_s  = max(compute_s, memory_s) + k0                      (views: 0)
#               = compute_s + memory_s + k0       (CUDA-core spatial convolutions: Note [Staged convolutions])
# i.e. efficiency ramps as F / (F + w_half * SMs): a kernel needs ~w_half FLOPs per SM before it fills the GPU, and
# a memory-bound kernel pays a fixed latency of mem_lat_cycles SM clock cycles (small kernels are latency-bound, and
# latency in cycles is what carries across GPUs: see Note [Memory latency]). e_c, m_c are per-category ceilings shared by every GPU; a_g, b_g are optional per-GPU factors
# (1.0 for a GPU that has no measurements: the spec alone predicts it). m_c has a forward and a backward-phase value. Host side: every op dispatched costs the
# host h (forward) or h_bwd (loss/backward/step) seconds times the GPU's host factor c_g; views cost h_view. Work is
# asynchronous, so a phase of ops j=1..n with host times H_j (cumulative) and kernel times d_j ends at
#     T = t0 + max_j (H_j + d_j + ... + d_n)        (the GPU is either starved by the host or busy)
# which is exactly the stream contract (start = max(host launch, stream done)) summed over the phase.
# Peaks: fp32 conv on Ampere+ uses TF32 tensor cores (cuDNN's allow_tf32 defaults to True; cuBLAS's does not);
# 16-bit conv/matmul/attention with tensor-core-friendly dims use the tensor-core peak on cc >= 7.0. Those
# tensor-core ops are priced by Note [Tensor-core efficiency], not by e_c and a.

MEMORY_CATEGORIES: tuple[str, ...] = tuple(c for c in CATEGORIES if c not in COMPUTE_CATEGORIES)
SHARED_PARAMS: tuple[str, ...] = (
    "e_conv", "e_conv_bwd", "e_grouped", "e_grouped_bwd", "e_matmul", "e_conv_1x1", "e_conv_1x1_bwd", "w_half", "m_elementwise", "m_norm",
    "m_other", "m_elementwise_bwd", "m_norm_bwd", "m_other_bwd", "mem_lat_cycles", "k0", "h", "h_bwd", "h_view", "t0",
    "t0_bwd", "bn_plane_half", "m_conv", "m_conv_bwd", "group_width_half",
)
# Note [Tensor-core convolution factor]
# Tensor-core kernels are priced at tc_eff of the tensor peak (Note [Tensor-core efficiency]), fitted on published
# GEMM throughputs, with no per-GPU factor: a and b apply to CUDA-core compute and to memory. Convolutions on tensor
# cores reach less than a GEMM (an H200 ran ResNet-50's fp16 channels_last 3x3 convolutions at 0.43-0.67 of its
# peak, its large GEMMs at 0.78; bench/data/h200-2026-11-27/micro.csv), so a measured GPU may carry a fourth factor
# t on the efficiency of its tensor-core convolutions (never GEMMs or attention), fitted with the others by
# `calibrate --add-gpu` (Note [Fitting a newly measured GPU] in calibrate.py). Every packaged GPU has t = 1.
PER_GPU_PARAMS: tuple[str, ...] = ("a", "b", "c", "t")  # compute, memory, host, tensor-core convolution factors
BORROWED_PARAMS: tuple[str, ...] = ("a", "b", "t")  # what an unfitted GPU takes from its nearest fitted one (not the host)


@dataclass(frozen=True)
class CostParams:
    """Fitted constants of the time model (see Note [Time model]); `per_gpu` maps catalog key -> factors."""

    shared: dict[str, float]
    per_gpu: dict[str, dict[str, float]] = field(default_factory=dict)
    tc_eff: float = 0.5  # fraction of the tensor-core peak a large tensor-core kernel reaches: Note [Tensor-core
    # efficiency]; the packaged value is fitted on published GEMM throughputs (fitted.json), 0.5 is the bare prior
    note: str = ""
    m_stream: float = 0.0  # streaming fraction of datasheet bandwidth for 16-bit memory-bound kernels, Note [16-bit
    # streaming]; fitted on published vector-kernel bandwidths (fitted.json); 0 = off (the fp32 fit's m_c apply)
    tc_eff_half_rate: float = 0.0  # tc_eff of GPUs with half-rate tensor cores (Note [Half-rate tensor cores]);
    # 0 = tc_eff
    not_lent: frozenset[str] = frozenset()  # GPUs whose factors serve themselves only (Note [Fitting a newly
    # measured GPU] in calibrate.py): fitted with --add-gpu, never borrowed by another GPU

    def tc_eff_for(self, spec: GPUSpec) -> float:
        """Return the share of `spec`'s tensor peak a large GEMM reaches (Note [Half-rate tensor cores])."""
        if spec.half_rate_tensor and self.tc_eff_half_rate > 0:
            return self.tc_eff_half_rate
        return self.tc_eff

    def factors(self, spec: GPUSpec, use_per_gpu: bool = True) -> dict[str, float]:
        """Return the per-GPU factors a, b, c for `spec`: its own, else the nearest fitted GPU's device factors a, b
        with the average host c = 1.0 (Note [Borrowed factors] in predict.py), else 1.0; all 1.0 with
        use_per_gpu=False."""
        base = {k: 1.0 for k in PER_GPU_PARAMS}
        if use_per_gpu:
            own = self.per_gpu.get(spec.key)
            if own:
                base.update(own)
            else:
                borrowed = self.per_gpu.get(self.factor_source(spec) or "", {})
                base.update({k: v for k, v in borrowed.items() if k in BORROWED_PARAMS})
        return base

    def factor_source(self, spec: GPUSpec) -> str | None:
        """Return the catalog key whose fitted factors `spec` uses (itself, the nearest fitted GPU, or None)."""
        if spec.key in self.per_gpu:
            return spec.key
        return nearest(spec, [k for k in self.per_gpu if k not in self.not_lent])

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object stored in fitted.json."""
        return {"shared": self.shared, "per_gpu": self.per_gpu, "tc_eff": self.tc_eff, "m_stream": self.m_stream,
                "tc_eff_half_rate": self.tc_eff_half_rate, "note": self.note}


DEFAULT_SHARED: dict[str, float] = {
    "e_conv": 0.6, "e_conv_bwd": 0.5, "e_grouped": 0.1, "e_grouped_bwd": 0.05, "e_matmul": 0.7, "e_conv_1x1": 0.6,
    "e_conv_1x1_bwd": 0.6, "w_half": 2e6, "m_elementwise": 0.75, "m_norm": 0.6, "m_other": 0.6,
    "m_elementwise_bwd": 0.75, "m_norm_bwd": 0.6, "m_other_bwd": 0.6,
    "mem_lat_cycles": 5e3, "k0": 3e-6, "h": 2e-5, "h_bwd": 1e-5, "h_view": 3e-6, "t0": 3e-4, "t0_bwd": 1e-3,
    "bn_plane_half": 256.0, "m_conv": 0.3, "m_conv_bwd": 0.3, "group_width_half": 16.0,
}


@functools.cache
def load_params() -> CostParams:
    """Return the packaged fitted constants (src/gpemu/cost/fitted.json), or priors when the file is absent."""
    try:
        text = resources.files("gpemu.cost").joinpath("fitted.json").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return CostParams(dict(DEFAULT_SHARED), note="unfitted priors")
    data = json.loads(text)
    shared = {**DEFAULT_SHARED, **data["shared"]}
    return CostParams(shared, data.get("per_gpu", {}), float(data.get("tc_eff", 0.5)), str(data.get("note", "")),
                      float(data.get("m_stream", 0.0)), float(data.get("tc_eff_half_rate", 0.0)),
                      frozenset(data.get("per_gpu_notes", {})))


def has_tensor_cores(spec: GPUSpec) -> bool:
    """Return True for GPUs with tensor cores (compute capability >= 7.0)."""
    return tuple(spec.compute_capability) >= (7, 0)


# Note [Tensor-core efficiency]
# A tensor-core op (16-bit conv/matmul/attention with tensor-core-friendly dims on cc >= 7.0; TF32 convolutions, and
# every conv/matmul/attention of dtype "tf32", on cc >= 8.0) is priced
#     compute_s = (F + w_half * SMs) / (peak_tc * tc_eff)
# with one tc_eff for every GPU and category, instead of the CUDA-core form's e_c * a: e_c are fitted on fp32
# CUDA-core kernels (e_conv > 1 is cuDNN's Winograd/FFT doing fewer multiplies than direct convolution, which its
# tensor-core implicit-GEMM kernels do not do) and the per-GPU a on CUDA-core data, so neither says anything about
# tensor cores. tc_eff is the fraction of the datasheet tensor peak a large GEMM reaches; it is fitted on published
# matmul throughputs of six GPUs (bench/published_validation.py, leave-one-out; docs/cost-model.md) and validated on
# whole published training steps (resnet50 AMP / TF32, BERT and GPT-2 layers) that are not in the fit. Until
# session 4 this was tc_rel = 0.5 times e_c (a prior): 0.45 of peak for a GEMM, 1.08 for a conv backward.
# Note [Half-rate tensor cores]
# A GeForce board's SM has the tensor cores of its professional sibling (GA102: RTX 3090 / RTX A6000; AD102: RTX
# 4090 / RTX 6000 Ada; GB202: RTX 5090 / RTX PRO 6000) but runs FP16/BF16 with FP32 accumulation, what cuBLAS and
# cuDNN use, and TF32 at half the rate (GPUSpec.half_rate_tensor; the datasheet peaks in gpus.toml are those half
# rates). Published large GEMMs reach all of that half peak, where full-rate parts reach three quarters of theirs:
# RTX 4090 172 TFLOPS fp16 / 86 tf32 against 165.2 / 82.6, RTX 3090 Ti 81 / 42 against 80 / 40 (mli's
# micro_bench, bench/published_validation.py), RTX 5090 214-240 against 209.5 (the rtx5090 entry's sources):
# with half the tensor throughput per SM, the same shared-memory and register paths keep the tensor cores fed, and
# these boards boost past their datasheet clock. Such GPUs take tc_eff_half_rate, fitted on the half-rate GEMM rows
# as tc_eff is on the others; the fused-attention ceiling (Note [Fused attention efficiency]) is capped by it as by
# tc_eff.
# Note [Fused attention efficiency]
# The fused attention kernels that scaled_dot_product_attention routes to (flash, memory-efficient: Note [SDPA
# backend choice] in torch_backend/sdpa.py) do their two matmuls per tile between an online softmax's exponentials,
# rescalings and shared-memory round trips, so they reach less of the tensor peak than a large GEMM (tc_eff).
# Stated, not fitted, from the kernels' own papers: FlashAttention-2, the kernel behind PyTorch's flash backend,
# reaches "50-73 % of the theoretical maximum FLOPs/s on A100" (Dao 2023, arXiv:2307.08691, abstract): priced at
# the geometric mean, 0.60 of the tensor peak, on every GPU before Hopper (its Ampere mma instructions run the same
# way on Ada; Volta and Turing get the memory-efficient kernel, for which no figure is published: the same 0.60,
# a lower bound on its time). On Hopper, FlashAttention-2 "achieves only 35 % utilization on the H100 GPU" (Shah et
# al. 2024, FlashAttention-3, arXiv:2407.08608, abstract): it does not use Hopper's warpgroup MMA or TMA, which
# the GEMMs that tc_eff describes do; priced at 0.35 from compute capability 9.0 on (datacenter Blackwell, cc 10.x,
# too: the same kernel beside tcgen05 GEMMs). Not on the Blackwell RTX SM (cc 12.x: RTX 50, RTX PRO Blackwell): it
# has neither warpgroup MMA nor tcgen05, so its GEMMs run the same warp-level mma.sync as FlashAttention-2, as on
# Ampere and Ada (Note [Blackwell RTX SM] in similarity.py): 0.60 there.
FUSED_ATTENTION_EFF = 0.60
FUSED_ATTENTION_EFF_HOPPER = 0.35


def fused_attention_eff(spec: GPUSpec, tc_eff: float) -> float:
    """Return the fraction of the tensor peak a fused attention kernel reaches on `spec` (Note [Fused attention
    efficiency]), never above tc_eff."""
    eff = FUSED_ATTENTION_EFF_HOPPER if warpgroup_gemms(spec) else FUSED_ATTENTION_EFF
    return min(tc_eff, eff)


def warpgroup_gemms(spec: GPUSpec) -> bool:
    """Return True where GEMMs use warpgroup MMA (Hopper) or tcgen05 (datacenter Blackwell): cc 9.0 to 11.x."""
    return (9, 0) <= tuple(spec.compute_capability) < (12, 0)


# Note [Attention kernels on Hopper]
# FUSED_ATTENTION_EFF_HOPPER (0.35, FlashAttention-3's figure for FlashAttention-2 on an H100) is what an H200 measured
# for the flash backend's forward at head dim 128 over long sequences (0.33-0.35 of 989.5 TFLOPS; bench/data/
# h200-2026-11-27/micro.csv, torch 2.11's flash and memory-efficient SDPA backends, bf16 and fp16, 1-32 x 12-16
# heads, 128-4,096 tokens). Everything else there ran slower, and 0.35 priced it up to 2-4x too fast (the memory-
# efficient backend's 4,096-token forward 676 TFLOP/s emulated, 116 measured). Four factors, each read off that
# table (medians over the long-sequence rows, sequence >= 1,024), scale it on these GPUs:
#   head dim d < 128   (d / 128) ** 0.65   forward at d = 64: 0.21-0.27 against 0.33-0.35 at d = 128
#   causal             0.72                with the FLOPs already halved: masked tiles still cost, work is unbalanced
#   backward           0.72                FA2's backward (five matmuls, atomics for dQ) against its forward
#   memory-efficient   0.5                 xformers' CUTLASS kernel, Ampere mma.sync, half the flash kernel
# The 28 long-sequence points land within 0.78-1.3x of the rule (it was 1.0-4.1x before). Short sequences (128-512
# tokens) run further below it: their kernels are latency-bound, which k0 and the memory time cover only in part.
# Not applied before Hopper: FUSED_ATTENTION_EFF (0.60) is the FlashAttention-2 paper's average over such shapes on an
# A100 and has no table of its own here.
ATTN_HEAD_DIM_EXP = 0.65
ATTN_CAUSAL = 0.72
ATTN_BACKWARD = 0.72
ATTN_MEM_EFFICIENT = 0.5


def attention_shape_scale(name: str, in_shapes: Sequence[Sequence[int]], flops: float) -> float:
    """Return the factor Note [Attention kernels on Hopper] puts on a fused attention op's efficiency, from its aten
    name, its input shapes (q first; the backward's grad_out first, then q) and its FLOPs (causal ones are halved)."""
    backward = name.endswith("_backward")
    q = in_shapes[1] if backward and len(in_shapes) > 1 else (in_shapes[0] if in_shapes else ())
    k = in_shapes[2] if backward and len(in_shapes) > 2 else (in_shapes[1] if len(in_shapes) > 1 else q)
    if len(q) < 2 or len(k) < 2:
        return 1.0
    d = int(q[-1])
    full = 4.0 * math.prod(int(x) for x in q[:-1]) * int(k[-2]) * d * (2.5 if backward else 1.0)
    scale = min(d, 128) / 128 if d > 0 else 1.0
    scale = scale**ATTN_HEAD_DIM_EXP
    if full > 0 and flops < 0.75 * full:
        scale *= ATTN_CAUSAL
    if backward:
        scale *= ATTN_BACKWARD
    if "efficient" in name:
        scale *= ATTN_MEM_EFFICIENT
    return scale


def uses_tensor_cores(spec: GPUSpec, dtype: str, category: str, tensor_core: bool) -> bool:
    """Return True when an op of this dtype/category runs on tensor cores on `spec` (Note [Tensor-core
    efficiency])."""
    if category not in COMPUTE_CATEGORIES:
        return False
    tf32 = spec.peak_tflops.get("tf32", 0.0) > 0
    if dtype in ("fp16", "bf16"):  # misaligned dims too, at a fraction of the peak: Note [Misaligned GEMMs]
        if category == "conv_grouped" and not tensor_core:  # See Note [Narrow groups on CUDA cores]
            return False
        return has_tensor_cores(spec) and spec.peak_tflops.get(dtype, 0.0) > 0
    if dtype == "tf32":
        return tf32
    return dtype == "fp32" and category == "conv" and tf32


# Note [Misaligned GEMMs]: 16-bit GEMMs whose dimensions are not multiples of 8 (GPT-2's 50257-token vocabulary, a
# 197-token ViT sequence at odd batch sizes) still run on tensor cores with the cuBLAS/cuDNN of any torch gpemu
# supports (CUDA >= 11), through slower kernels, rather than falling back to CUDA-core FMA (which priced GPT-2's LM
# head 13x slower than aligned). MISALIGNED_TC_FRACTION is the stated size of that penalty, from one public
# observation (Karpathy on nanoGPT: padding GPT-2's vocabulary from 50257 to 50304 made 124M training ~25 % faster).
# The LM head is ~31 % of that step's matmul FLOPs; with the rest unchanged, (r - 1) * 0.31 = 0.25 to 0.33 gives an
# unaligned head r = 1.8 to 2.1 times slower than the aligned one, so misaligned 16-bit ops get half the tensor
# peak. Not fitted; A100-class hardware; the first convolution of an image model (3 input channels, which cuDNN
# pads) is priced the same way.
MISALIGNED_TC_FRACTION = 0.5


# Note [Misaligned GEMMs on Hopper]
# Hopper's warpgroup GEMMs (and datacenter Blackwell's tcgen05 ones) load their tiles with the tensor memory
# accelerator, which needs 16-byte-aligned strides: a 16-bit GEMM whose K or N (the leading dimensions; the rows M
# never are one) is not a multiple of 8 elements falls back to Ampere-style kernels, far from the new peak. An H200
# (bench/data/h200-2026-11-27, torch.profiler, AMP at batch 16 x 512 tokens, cuBLAS of CUDA 13.0) ran GPT-2's LM head
# (vocabulary 50,257: odd) at 100 / 140 / 147 TFLOP/s (forward addmm, the two backward mms: 0.10-0.15 of its 989
# TFLOP/s peak) and BERT-base's (30,522: even) at 239 / 240 / 256 (0.24-0.26), where its aligned layer GEMMs reached
# 600-700. Note [Misaligned GEMMs]'s half peak (x tc_eff: 0.375 of the datasheet) priced both at 371: 3.6x and 1.5x
# too fast. On cc 9.0-11.x a misaligned 16-bit GEMM therefore gets HOPPER_MISALIGNED_EVEN of the peak when K and N
# are even (x tc_eff = 0.25 of the datasheet) and HOPPER_MISALIGNED_ODD when one is odd (0.13). Earlier GPUs keep the
# half peak (Karpathy's A100 figure). Convolutions with unaligned channels (an image model's 3-channel first layer)
# are not GEMMs in this sense and keep Note [Misaligned GEMMs]'s price.
HOPPER_MISALIGNED_EVEN = 0.33
HOPPER_MISALIGNED_ODD = 0.17


# Note [Narrow groups on CUDA cores]
# A grouped convolution whose group width (input channels per group) is not a multiple of 8 -- every depthwise
# convolution, and ResNeXt-50 32x4d's 4-channel groups -- has no channel reduction to feed a tensor core: cuDNN's
# 16-bit depthwise kernels and PyTorch's own (conv_depthwise2d, which its NCHW bf16 and most of its NCHW fp16
# depthwise calls take) are CUDA-core kernels that accumulate in fp32. So a 16-bit one is priced like the fp32
# grouped convolutions of the calibration data, on CUDA cores at the group-width efficiency (Note [Group width]) and
# the GPU's factor a, with its 16-bit bytes; until session 9 it was a misaligned tensor-core GEMM (Note [Misaligned
# GEMMs]) whose FLOPs cost next to nothing, leaving only a streaming memory time. Wider groups (RegNets' 8-64
# channels, ResNeXt 32x8d) keep the tensor-core price. Checked on timm's RTX 3090 AMP rows (bench/timm_validation.py,
# NCHW and NHWC, 34 models; docs/cost-model.md): the depthwise networks move 5-20 points slower (NHWC
# mobilenetv3_large_100 +33.8 -> +22.8 %, efficientnet_b0 +19.3 -> +8.1 %, mnasnet_100 +16.1 -> +1.7 %, ghostnet
# +55.7 -> +45.8 %), ConvNeXt's 7x7 depthwise layers 15 points (convnext_tiny +8.4 -> -9.9 %), to where the board's
# plain CNNs and transformers already were (median -10 %); the spread of the 31 non-RegNet models around that median
# (median absolute deviation of the log error) shrinks from 11.5 to 8.3 % (NCHW) and 14.2 to 10.4 % (NHWC). Tried in
# session 8 and dropped then for moving ConvNeXt away from zero, before the layout change of session 9 showed that
# board's CNNs sit 10-20 % slow in every layout. Not fitted: the efficiencies are the fp32 fit's.


# Note [Sustained clock]
# Datasheet peaks are at the boost clock. A GPU whose sustained clock under a full training load is documented to be
# lower (GPUSpec.sustained_clock_mhz) is priced at that clock: every FLOP peak scales by load_clock_ratio, the memory
# latency (mem_lat_cycles, counted in SM cycles) is paid at that clock, and, where the SM clock also limits
# device-memory bandwidth (GPUSpec.full_bandwidth_clock_mhz), bandwidth scales by min(1, clock / that clock). Only the
# K80 sets these fields: a K80 die's base (default application) clock is 562 MHz, autoboost raising it towards 875
# MHz only as the board's 300 W shared by two dies allows; and NVIDIA's K80 autoboost post (its author, in the
# comments) says a K80 needs an SM clock of about 705 MHz for full memory bandwidth, so at 562 MHz it streams at
# 562/705 of it. Session 3 tried the clock alone (compute and latency, bandwidth left at the datasheet 240 GB/s) and
# it explained under a quarter of the K80's error; the bandwidth coupling is what moves the memory-bound kernels,
# which are as slow as the compute-bound ones (mobilenet_v2 1.7x, VGG 1.8x, ResNets 2.0-2.3x the M40's time at
# batch >= 32). Leave-one-GPU-out (bench/predict_validation.py), K80 fwd+bwd median / p90: spec-model 38.1 / 48.7
# -> 19.8 / 33.4 %, scaled from the M40 33.4 / 42.6 -> 13.5 / 24.2 %. Nothing here is fitted to the K80's rows:
# 562 and 705 MHz are NVIDIA's figures, and no other GPU of the catalog sets either field.
def peak_flops(spec: GPUSpec, dtype: str, category: str, tensor_core: bool, gemm_align: int = 8) -> float:
    """Return the peak FLOP/s an op of this dtype/category runs against on `spec`: the tensor-core peak where
    uses_tensor_cores, else the CUDA-core one (see Note [Time model]), at the sustained clock (Note [Sustained
    clock]); `gemm_align` a GEMM's leading-dimension alignment (Note [Misaligned GEMMs on Hopper])."""
    return _boost_peak_flops(spec, dtype, category, tensor_core, gemm_align) * spec.load_clock_ratio


def _boost_peak_flops(spec: GPUSpec, dtype: str, category: str, tensor_core: bool, gemm_align: int = 8) -> float:
    fp32 = spec.peak_tflops["fp32"] * 1e12
    if dtype == "fp64":
        return spec.peak_tflops["fp64"] * 1e12 or fp32 / 32
    if uses_tensor_cores(spec, dtype, category, tensor_core):
        peak = spec.peak_tflops["tf32" if dtype in ("fp32", "tf32") else dtype] * 1e12
        if dtype in ("fp16", "bf16") and not tensor_core:  # Note [Misaligned GEMMs]
            if category == "matmul" and gemm_align < 8 and warpgroup_gemms(spec):  # Note [Misaligned GEMMs on Hopper]
                return peak * (HOPPER_MISALIGNED_EVEN if gemm_align >= 2 else HOPPER_MISALIGNED_ODD)
            return peak * MISALIGNED_TC_FRACTION
        return peak
    if dtype in ("fp16", "bf16"):
        native = spec.peak_tflops.get(dtype, 0.0) * 1e12
        if not native or has_tensor_cores(spec):
            return fp32  # no native 16-bit math (bf16 before Ampere)
        return native  # packed half2 on CUDA cores (P100)
    if category == "matmul" and is_hopper(spec):  # Note [FP32 GEMMs on Hopper]
        return fp32 * HOPPER_SGEMM_SHARE
    return fp32


# Note [FP32 GEMMs on Hopper]
# An fp32 GEMM without TF32 (torch's default: Note [FP32 math modes] in roofline.py) runs on CUDA cores at e_matmul
# (0.9, the fit's cap: large SGEMMs reach ~90 % of peak on the GPUs it was fitted on). An H200 reached 0.73-0.75 of
# its 67 TFLOPS datasheet peak on square 4096-8192 products and 0.67-0.69 on transformer shapes (bench/data/
# h200-2026-11-27/micro.csv: 48.8-50.5 and 44.6-46.4 TFLOP/s); the Hopper SM's fp32 peak counts 128 FMA lanes per SM
# that an SGEMM's operand traffic does not keep fed. Priced against 0.75 / 0.9 of the datasheet fp32 peak on compute
# capability 9.x: the unmodified nn.Transformer language model of bench/gpu_session.sh (fp32, IEEE GEMMs) ran 20 %
# faster emulated than on the H200 before. Other GPUs with 128 fp32 lanes per SM (GA10x, Ada) are not measured here.
HOPPER_SGEMM_SHARE = 0.75 / 0.9


def _mem_param(category: str) -> str:
    if category in ("elementwise", "optimizer", "copy", "conv", "conv_grouped", "matmul", "attention"):
        return "m_elementwise"
    if category == "norm":
        return "m_norm"
    return "m_other"


@dataclass
class OpArrays:
    """Per-op columns of a traced phase, ready for vectorised timing (flops/bytes may be batch-linear)."""

    names: list[str]
    category: list[str]
    dtype: list[str]
    tensor_core: np.ndarray  # bool
    phase: np.ndarray  # 0 forward, 1 backward (incl. loss), 2 optimizer
    flops: np.ndarray  # at the reference batch (or the per-batch intercept when batch-linear)
    bytes: np.ndarray
    flops_per_sample: np.ndarray | None = None
    bytes_per_sample: np.ndarray | None = None
    views_before: np.ndarray | None = None  # set by compress_views: view ops folded into the next kernel's host time
    plane: np.ndarray | None = None  # batch-norm ops: elements per contiguous (n, c) plane, H*W; inf for other ops
    layout: np.ndarray | None = None  # conv / batch-norm ops: LAYOUT_NCHW or LAYOUT_NHWC; LAYOUT_NONE elsewhere
    relayout_bytes: np.ndarray | None = None  # conv ops: activation bytes (Note [Layout cost]); batch-linear like bytes
    relayout_bytes_per_sample: np.ndarray | None = None
    pointwise: np.ndarray | None = None  # bool: 1x1 convolutions (Note [Pointwise convolutions])
    group_width: np.ndarray | None = None  # grouped convolutions: input channels per group (Note [Group width])
    out_channels: np.ndarray | None = None  # dense convolutions: output channels (Note [bf16 convolutions before
    # Ampere]); 0 elsewhere
    conv_batch: np.ndarray | None = None  # dense convolutions: samples (the input's first dimension), 0 elsewhere;
    conv_batch_per_sample: np.ndarray | None = None  # batch-linear like flops (Note [bf16 convolutions before Ampere])
    attn_scale: np.ndarray | None = None  # fused attention ops: Note [Attention kernels on Hopper]; 1 elsewhere
    row_len: np.ndarray | None = None  # layer norms: their row length R (Note [Layer-norm row length]); 0 elsewhere
    channel_per_byte: np.ndarray | None = None  # NCHW training batch norms: one channel's elements per byte the op
    # moves (batch-independent), 0 elsewhere (Note [Batch norm, one block per channel])
    gemm_align: np.ndarray | None = None  # GEMMs: leading-dimension alignment in elements, 8 elsewhere (Note
    # [Misaligned GEMMs on Hopper])

    def at_batch(self, batch_size: float) -> tuple[np.ndarray, np.ndarray]:
        """Return (flops, bytes) at `batch_size` (batch-linear arrays) or the stored ones."""
        if self.flops_per_sample is None or self.bytes_per_sample is None:
            return self.flops, self.bytes
        return self.flops + self.flops_per_sample * batch_size, self.bytes + self.bytes_per_sample * batch_size

    def conv_batch_at(self, batch_size: Any) -> np.ndarray | None:
        """Return dense convolutions' samples at `batch_size` (None when not recorded)."""
        if self.conv_batch is None or self.conv_batch_per_sample is None:
            return self.conv_batch
        return self.conv_batch + self.conv_batch_per_sample * batch_size

    def relayout_at_batch(self, batch_size: Any) -> np.ndarray:
        """Return conv ops' activation bytes at `batch_size` (zeros when not recorded)."""
        act = self.relayout_bytes if self.relayout_bytes is not None else np.zeros(len(self.names))
        if self.relayout_bytes_per_sample is None:
            return act
        return act + self.relayout_bytes_per_sample * batch_size

    def pick(self, idx: np.ndarray) -> OpArrays:
        """Return the ops at positions `idx` (every per-op column subset alike)."""
        sub = lambda xs: None if xs is None else xs[idx]  # noqa: E731
        return OpArrays([self.names[i] for i in idx], [self.category[i] for i in idx],
                        [self.dtype[i] for i in idx], self.tensor_core[idx], self.phase[idx], self.flops[idx],
                        self.bytes[idx], sub(self.flops_per_sample), sub(self.bytes_per_sample), sub(self.views_before),
                        sub(self.plane), sub(self.layout), sub(self.relayout_bytes), sub(self.relayout_bytes_per_sample),
                        sub(self.pointwise), sub(self.group_width), sub(self.out_channels), sub(self.conv_batch),
                        sub(self.conv_batch_per_sample), sub(self.attn_scale), sub(self.row_len),
                        sub(self.channel_per_byte), sub(self.gemm_align))


_PHASE_ID = {"forward": 0, "backward": 1, "optimizer": 2}
LAYOUT_NONE, LAYOUT_NCHW, LAYOUT_NHWC = 0, 1, 2
_LAYOUT_ID = {"": LAYOUT_NONE, "nchw": LAYOUT_NCHW, "nhwc": LAYOUT_NHWC}


BATCH_NORM_OPS: frozenset[str] = frozenset({
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "cudnn_batch_norm",
    "_native_batch_norm_legit_no_training", "native_batch_norm_backward", "cudnn_batch_norm_backward"})


def bn_plane(name: str, shape: Sequence[int]) -> float:
    """Return the elements of one contiguous (n, c) plane (H*W) a batch-norm op streams over its NCHW input, inf
    for other ops and for 2-D inputs (see Note [Batch-norm plane size])."""
    if name not in BATCH_NORM_OPS or len(shape) <= 2:
        return math.inf
    return float(math.prod(shape[2:]))


def is_pointwise_conv(name: str, category: str, shapes: Sequence[Sequence[int]]) -> bool:
    """Return True for a dense convolution (forward or backward) whose kernel is 1x1 (Note [Pointwise
    convolutions]); `shapes` are the op's tensor-argument shapes in order (the weight is the 2nd, or the 3rd of a
    convolution_backward)."""
    if category != "conv":
        return False
    idx = 2 if name == "convolution_backward" else 1
    if len(shapes) <= idx or len(shapes[idx]) < 3:
        return False
    return all(int(k) == 1 for k in shapes[idx][2:])


def conv_group_width(name: str, category: str, shapes: Sequence[Sequence[int]]) -> float:
    """Return a grouped convolution's input channels per group (1 for depthwise; Note [Group width]), 1.0 for every
    other op; `shapes` are the op's tensor-argument shapes (the weight is the 2nd, or the 3rd of a
    convolution_backward)."""
    if category != "conv_grouped":
        return 1.0
    idx = 2 if name == "convolution_backward" else 1
    if len(shapes) <= idx or len(shapes[idx]) < 3:
        return 1.0
    return float(max(1, int(shapes[idx][1])))


def conv_out_channels(name: str, category: str, shapes: Sequence[Sequence[int]]) -> float:
    """Return a dense convolution's output channels (the weight's first dimension), 0.0 for every other op and for
    a 1x1 one (Note [bf16 convolutions before Ampere]: no column matrix); `shapes` as for conv_group_width."""
    if category != "conv" or is_pointwise_conv(name, category, shapes):
        return 0.0
    idx = 2 if name == "convolution_backward" else 1
    if len(shapes) <= idx or len(shapes[idx]) < 3:
        return 0.0
    return float(shapes[idx][0])


def _first_shape(record: Any) -> tuple[int, ...]:
    shapes = getattr(record, "in_shapes", ())  # OpRecord-like objects without shapes get no batch-norm ramp
    return tuple(shapes[0]) if shapes else ()


def op_arrays(records: Sequence[Any]) -> OpArrays:
    """Return OpArrays for a list of gpemu.workloads.optrace.OpRecord."""
    return OpArrays(
        names=[r.name for r in records],
        category=[r.category for r in records],
        dtype=[r.dtype for r in records],
        tensor_core=np.array([r.tensor_core for r in records], dtype=bool),
        phase=np.array([_PHASE_ID[r.phase] for r in records], dtype=np.int64),
        flops=np.array([r.flops for r in records], dtype=np.float64),
        bytes=np.array([r.bytes for r in records], dtype=np.float64),
        plane=np.array([bn_plane(r.name, _first_shape(r)) for r in records], dtype=np.float64),
        layout=np.array([_LAYOUT_ID.get(getattr(r, "layout", ""), 0) for r in records], dtype=np.int64),
        relayout_bytes=np.array([float(getattr(r, "relayout_bytes", 0.0)) for r in records], dtype=np.float64),
        pointwise=np.array([is_pointwise_conv(r.name, r.category, getattr(r, "in_shapes", ())) for r in records],
                           dtype=bool),
        group_width=np.array([conv_group_width(r.name, r.category, getattr(r, "in_shapes", ())) for r in records],
                             dtype=np.float64),
        out_channels=np.array([conv_out_channels(r.name, r.category, getattr(r, "in_shapes", ()))
                               for r in records], dtype=np.float64),
        conv_batch=np.array([float(_first_shape(r)[0]) if r.category == "conv" and _first_shape(r) else 0.0
                             for r in records], dtype=np.float64),
        attn_scale=np.array([attention_shape_scale(r.name, getattr(r, "in_shapes", ()), r.flops)
                             if r.category == "attention" else 1.0 for r in records], dtype=np.float64),
        row_len=np.array([float(_first_shape(r)[-1]) if r.name in _ROW_NORM_OPS and _first_shape(r) else 0.0
                          for r in records], dtype=np.float64),
        channel_per_byte=np.array([channel_elems_per_byte(float(getattr(r, "channel_elems", 0.0)), r.bytes)
                                   for r in records], dtype=np.float64),
        gemm_align=np.array([int(getattr(r, "gemm_align", 8)) for r in records], dtype=np.int64),
    )


@dataclass
class SpecColumns:
    """Per-op constants for one (ops, GPU) pair: effective peak, bandwidth, which parameters apply."""

    peak: np.ndarray
    tensor_core: np.ndarray  # bool: priced at tc_eff of the tensor-core peak (Note [Tensor-core efficiency])
    tc_eff: float
    fused_attention: np.ndarray  # bool: tensor-core fused attention, at attention_eff instead (Note [Fused attention
    attention_eff: np.ndarray  # efficiency]), per op: Note [Attention kernels on Hopper]
    stream: np.ndarray  # bool: 16-bit streaming kernels priced at m_stream (Note [16-bit streaming])
    m_stream: float
    relayout_stream: np.ndarray  # bool: a 16-bit convolution's layout transposes also stream at m_stream
    is_kernel: np.ndarray
    compute_param: np.ndarray  # index into COMPUTE_PARAMS, -1 for memory-only ops
    mem_param: np.ndarray  # index into MEMORY_PARAMS
    plane: np.ndarray  # batch-norm plane elements (inf elsewhere), Note [Batch-norm plane size]
    relayout: np.ndarray  # conv ops in a layout not native to their kernel: tensors cuDNN transposes (0 elsewhere)
    staged: np.ndarray  # bool: CUDA-core spatial convolutions, memory and compute add (Note [Staged convolutions])
    group_width: np.ndarray  # grouped convolutions' input channels per group, 1 elsewhere (Note [Group width])
    column_bytes_per_flop: np.ndarray  # lowered convolutions' column-matrix bytes per FLOP, 0 elsewhere (Note [bf16
    # convolutions before Ampere])
    kernels_per_sample: np.ndarray  # lowered convolutions' kernels per sample (2 forward, 4 backward), 0 elsewhere
    bw: float
    sm_count: int
    clock_hz: float
    tc_conv: np.ndarray  # bool: convolutions on tensor cores, their efficiency times f["t"] (Note [Tensor-core
    # convolution factor])
    row_ramp: np.ndarray  # layer norms' row-length factor on memory efficiency (Note [Layer-norm row length])
    channel_cycles_per_byte: np.ndarray  # NCHW training batch norms: SM cycles of one channel's block per byte the op
    # moves, 0 elsewhere (Note [Batch norm, one block per channel])
    channel_floor_bytes: np.ndarray  # the op's bytes beyond which a channel is past the single-read size (inf: never)
    pool_cycles_per_flop: np.ndarray  # pooling forwards: SM cycles per counted element over the whole GPU, 0
    # elsewhere (Note [Pooling kernels are issue-bound])


COMPUTE_PARAMS: tuple[str, ...] = ("e_conv", "e_conv_bwd", "e_grouped", "e_grouped_bwd", "e_matmul", "e_conv_1x1",
                                   "e_conv_1x1_bwd")
CONV_COMPUTE_PARAMS: tuple[int, ...] = (0, 1, 2, 3, 5, 6)  # every COMPUTE_PARAMS index but e_matmul


# Note [Pointwise convolutions]
# e_conv / e_conv_bwd are efficiencies against direct-convolution FLOPs and come out above 1 (1.4 and 2.2) because
# cuDNN runs 3x3 (and 5x5, 7x7) convolutions with Winograd / FFT algorithms that do fewer multiplies. A 1x1
# convolution is a plain GEMM over the channel dimension (cuDNN's implicit-GEMM kernels; no Winograd or FFT
# variant exists for it), so it cannot beat the peak and gets its own efficiencies, e_conv_1x1 / e_conv_1x1_bwd,
# capped at 1 in the fit. With one e_conv for both, the bottleneck networks (ResNet-50/101/152, ResNeXt,
# DenseNets, GoogLeNet: most of their convolution FLOPs are 1x1) had their compute priced too cheap, i.e. they came
# out too memory-bound, so a GPU whose compute is relatively slower than its bandwidth (K80 and M40 against a P100)
# was predicted too fast on them and too slow on VGG: leave-one-GPU-out signed error at batch >= 32, K80 <- M40,
# resnet101 -25 %, vgg19 +12 %; M40 <- P100, resnet50 +18 %, vgg19 -15 % (session 5, before this split).
def compute_param_index(category: str, name: str, pointwise: bool = False) -> int:
    """Return the index into COMPUTE_PARAMS for an op (-1 for ops priced by bytes only); `pointwise`: a 1x1
    convolution (Note [Pointwise convolutions])."""
    if category in ("matmul", "attention"):
        return 4
    if category == "conv" and pointwise:
        return 5 + int(name.endswith("_backward"))
    if category in ("conv", "conv_grouped"):
        return (0 if category == "conv" else 2) + int(name.endswith("_backward"))
    return -1


# Note [Staged convolutions]
# e_conv / e_conv_bwd come out above 1 (direct-convolution FLOPs per second over the peak): on CUDA cores cuDNN runs
# a spatial (kernel > 1x1) convolution with algorithms that rearrange the data before multiplying it: Winograd and
# FFT (a transform kernel rewrites the input and the filter into tiles, a batched GEMM multiplies them, a second
# transform writes the output) or an explicit or precomputed-index GEMM lowering (im2col: the input copied k*k
# times into a column matrix). The rearranging stages are memory-bound, the GEMM compute-bound, and they run one
# after another, so the convolution's time is their sum, not the roofline's max:
#     kernel_s = (F + w_half * SMs) / (peak * e_conv * a) + M / (bw * m_conv * b) + mem_lat_cycles / clock + k0
# with M the op's minimal bytes (x, w, y) and m_conv its own efficiency, since the staged tensors are larger than x
# and y: Winograd F(4x4, 3x3) makes a 6x6 tile per 4x4 outputs (36/16 = 2.25x), each tiled tensor written once and
# read once, x + 2 * 2.25 x + 2 * 2.25 y + y = 5.5 (x + y) when x ~ y, so m_conv ~ 0.75 / 5.5 ~ 0.14 of the
# datasheet bandwidth at a typical 0.75 streaming fraction. Fitted (the fold fits of bench/predict_validation.py,
# 2026-11-23): m_conv 0.13-0.16 on the four folds that keep the K80 (0.29 without it), m_conv_bwd 0.32-0.41, e_conv
# 2.4-2.7 (F(4x4, 3x3) does 4x fewer multiplies than direct convolution: its GEMM stage at 0.6-0.7 of peak); the
# packaged fit (200 steps) has e_conv at its cap of 3, m_conv 0.125, m_conv_bwd 0.19.
# 1x1 convolutions (one implicit-GEMM kernel, Note [Pointwise convolutions]), grouped/depthwise convolutions (one
# direct kernel), GEMMs and every tensor-core op (cuDNN's implicit-GEMM kernels, no separate stage) keep the max.
# Why it matters across GPUs: with the max, a convolution was priced by FLOPs alone, so a GPU's speed on VGG-like
# networks followed its FP32 peak; measured, the V100 runs VGG 8 % faster than the Quadro RTX 6000 (peak: 14 % slower)
# and the P100 1.9x the M40 (peak: 1.36x): the bandwidth-rich GPUs win the memory-bound stages. Leave-one-GPU-out
# (bench/predict_validation.py, median / p90 %), scaled from the nearest GPU: forward 10.9 / 22.9 -> 7.2 / 22.4,
# fwd+bwd 8.2 / 19.8 -> 7.5 / 19.5; spec model fwd+bwd 12.8 / 29.8 -> 11.3 / 29.2.
# Tried and dropped (same bench): (1) one fitted overlap fraction for every CUDA-core conv/GEMM, t = max + x * min:
# x went to its cap of 1 (no overlap) in every fold, and uncapped to ~5 with every memory efficiency at its cap of 1
# (the conv's bytes are what is missing, hence m_conv); (2) the sum for 1x1, grouped convolutions and GEMMs too:
# fwd+bwd 7.1 / 19.2 scaled, forward 8.2 / 21.1, and the elementwise efficiency fitted at its cap of 1.0 of the
# datasheet bandwidth, which no published stream kernel reaches; (3) only 3x3 / 5x5 stride-1 convolutions (the
# Winograd shapes) staged: fwd+bwd 7.7 / 19.5 scaled, 11.8 / 29.6 spec, and m_conv_bwd drifts to 0.8: the strided
# and 7x7 convolutions' backward (stems, downsampling) behave as staged too; (4) an additive instruction-issue term
# for memory-bound ops, bytes * iota / (fp32 peak * a): 7.2 / 19.2 scaled, iota 0.5-1.2 FLOP per byte from fold to
# fold (weakly identified), not kept.
# Note [bf16 convolutions before Ampere]
# torch hands a bf16 convolution to cuDNN only on compute capability >= 8.0 (ConvParams::use_cudnn asks
# CUDAHooks::supportsBFloat16ConvolutionWithCuDNNv8, which checks `major >= 8`). Below it - V100, T4, P100 - a dense
# bf16 convolution runs ATen's own slow_conv2d: per sample, im2col writes a column matrix of C_in*kh*kw x oH*oW
# elements and a cuBLAS GEMM (bf16 storage, fp32 math on CUDA cores: no bf16 tensor cores) multiplies it with the
# weight; its backward is a GEMM plus col2im for grad_input and im2col plus a GEMM for grad_weight. So it has
# neither cuDNN's Winograd / FFT (e_conv = 3 is that: fewer multiplies than the direct FLOPs) nor tensor cores. It
# was priced as a cuDNN fp32 CUDA-core convolution with half the bytes, 1.6x faster than the fp32 one (V100, the 64 x
# 32 x 26 x 26 3x3 convolution: 98.3 vs 156.2 us; T4 223.9 vs 385.2), while a bf16 GEMM prices as the fp32 one. Now
# such a convolution (category "conv", bf16, cc < 8.0) is priced as that lowering: its FLOPs at the GEMM efficiency
# e_conv_1x1[_bwd] (a 1x1 convolution is a plain GEMM: Note [Pointwise convolutions]) against the fp32 peak, and
# its bytes plus the column matrix, written once and read once per im2col or col2im (2 bytes an element), at the
# elementwise memory efficiency, stage after stage (compute + memory, as Note [Staged convolutions]). The column
# bytes follow from the FLOPs: the forward's columns hold F / (2 C_out) elements (F = 2 C_out x the column
# elements), written and read: 2 F / C_out bytes; the backward does twice the FLOPs and twice the column traffic
# (col2im's and im2col's matrices): again 2 F / C_out. A 1x1 convolution has no column matrix (its GEMM reads the
# input as is; a strided one's small im2col is left out). The loop runs per sample: N samples launch 2N kernels
# forward (im2col, GEMM) and 4N backward (GEMM, col2im; im2col, GEMM), one fewer per sample for a 1x1 one, where cuDNN
# launches one or a few; each kernel past the first pays the model's fixed per-kernel cost, mem_lat_cycles / clock +
# k0 (Note [Time model]); the FLOPs keep one fill ramp (the per-sample GEMMs are smaller, so slower still). A
# backward without grad_input (a first layer) launches 2N on the card and is charged 4N.
# The dtype is the only switch: fp16 convolutions keep cuDNN's tensor cores (cc >= 7.0), every fp32 one is
# unchanged. Grouped bf16 convolutions keep their CUDA-core grouped price (torch runs the wide-group ones as the
# same lowering once per group, depthwise ones on conv_depthwise2d: Note [Narrow groups on CUDA cores]). Not
# measured on a card (no V100 here); derived from torch's code path.
def lowered_conv(spec: GPUSpec, dtype: str, category: str) -> bool:
    """Return True when a convolution runs ATen's im2col + GEMM lowering on `spec` (Note [bf16 convolutions before
    Ampere])."""
    return dtype == "bf16" and category == "conv" and tuple(spec.compute_capability) < (8, 0)


def lowered_kernels_per_sample(name: str, pointwise: bool) -> float:
    """Return the kernels a lowered convolution launches per sample: forward im2col + GEMM, backward GEMM + col2im
    and im2col + GEMM; a 1x1 one skips im2col (Note [bf16 convolutions before Ampere])."""
    if name.endswith("_backward"):
        return 3.0 if pointwise else 4.0
    return 1.0 if pointwise else 2.0


def column_bytes_per_flop(out_channels: Any) -> Any:
    """Return a lowered convolution's column-matrix bytes per FLOP, 2 / C_out (0 where C_out is 0: a 1x1 one; Note
    [bf16 convolutions before Ampere])."""
    c = np.asarray(out_channels, dtype=np.float64)
    return np.where(c > 0, 2.0 / np.maximum(c, 1.0), 0.0)


def staged_conv(compute_param: np.ndarray, on_tensor_cores: np.ndarray) -> np.ndarray:
    """Return, per op, whether it is priced as a staged CUDA-core spatial convolution, compute plus memory (Note
    [Staged convolutions]); `compute_param` indexes COMPUTE_PARAMS (e_conv / e_conv_bwd are 0 / 1)."""
    return np.isin(compute_param, (0, 1)) & ~on_tensor_cores


MEMORY_PARAMS: tuple[str, ...] = ("m_elementwise", "m_norm", "m_other", "m_elementwise_bwd", "m_norm_bwd",
                                  "m_other_bwd", "m_conv", "m_conv_bwd")
_MEM_IDX = {name: i for i, name in enumerate(MEMORY_PARAMS)}


def mem_param(category: str, backward: bool) -> str:
    """Return the memory-efficiency parameter of an op (backward-phase ops have their own: e.g. max-pool backward
    is a scatter, far slower per byte than the forward window max)."""
    if category == "pooling" and not backward:  # See Note [Pooling kernels are issue-bound]
        return "m_elementwise"
    return _mem_param(category) + ("_bwd" if backward else "")



# Note [Layout cost]
# Memory format (NCHW vs channels_last / NHWC, read from strides: Note [Memory format] in registry.py) changes two
# things in the time model; fp32 NCHW on a GPU without TF32 (all the calibration data) changes in neither.
#  1. Convolutions. cuDNN's 16-bit tensor-core kernels (cc >= 7.0) are NHWC-native; its CUDA-core fp32 kernels
#     are NCHW-native; TF32 convolutions (cc >= 8.0) are taken as layout-neutral (cuDNN 8 ships NCHW-native TF32
#     implicit-GEMM kernels, and no published A100 TF32 NCHW-vs-NHWC pair says otherwise: pricing them NHWC-native
#     took the published A100 TF32 NCHW resnet50 from 7 % to 15 % too slow). A convolution in the other layout is run by transposing each of its
#     activation tensors into the native one and the result back (nchwToNhwcKernel / nhwcToNchwKernel in a profile):
#     forward x and y (none for a 16-bit NCHW forward: Note [NCHW forward on cuDNN 9]), backward dy, x and dx, each
#     read and written once. Those transposes are separate
#     memory-bound kernels, so they add  2 * relayout_bytes / (bw * m_elementwise[_bwd] * b) + n * (mem_lat_cycles /
#     clock + k0) (n tensors transposed; 16-bit ones stream at m_stream, Note [16-bit streaming]) to the time. Every
#     convolution pays them, 1x1 ones included. (Until session 9 a 1x1 stride-1 convolution was exempt, as a plain
#     GEMM over channels in either layout. timm's paired RTX 3090 AMP rows, the same runs in NCHW and NHWC, say
#     otherwise: the bottleneck networks, whose convolutions are mostly 1x1, gain the most from NHWC (resnet50 1.47x,
#     resnext50_32x4d 1.51x, seresnet50 1.36x) and the 3x3-only resnet18/34 the least (1.26x), where the exemption
#     predicted 1.14-1.17x for all of them; with it gone the predicted ratios straddle the published ones (resnet50
#     1.37, resnext50 1.34, resnet18 1.16, densenet121 1.39 vs 1.25; docs/cost-model.md). Lambda's resnet50 AMP NCHW
#     rows, not used for this, moved from 30-55 % too fast on A100 / H100 to 7-27 %, and the V100 fp32 NHWC row
#     from 11.8 % too fast to 2.7 % too slow.) Nothing is fitted; cuDNN also picks different (often worse) main
#     kernels for a foreign layout, which this does not model.
#  2. Batch norm. NCHW batch norm streams (n, c) planes of H*W elements (Note [Batch-norm plane size]); an NHWC
#     kernel reads whole channel vectors of every pixel, coalesced whatever H*W is: no plane ramp, same ceiling.
#     (Tried and dropped: an NHWC ceiling of max(m_norm[_bwd], m_elementwise[_bwd]), i.e. "at least a plain
#     stream". It made fp32 channels_last resnet50 on a V100 predict 35 % faster than published, where NHWC fp32
#     is 21 % slower than NCHW; 16-bit batch norm is priced by Note [16-bit streaming] either way.)
# On the published resnet50 rows (bench/published_validation.py, the sandeepkumar-skb V100 pairs) the NHWC / NCHW
# speed ratio comes out 1.42 for AMP (published 1.37) and 0.92 for fp32 (published 0.83).
# Note [NCHW forward on cuDNN 9]
# The transposes above are what cuDNN 8 did (timm's 2022 rows, PyTorch 1.12 / cuDNN 8.3). cuDNN 9 runs the forward of
# a 16-bit NCHW convolution with NCHW-native tensor-core kernels: no transposes. timm's inference rows of the same
# RTX 3090 (bench/timm_infer_validation.py) show it: from PyTorch 1.12 to 2.4 resnet50's NCHW throughput rose 18 %
# (2733 -> 3219 samples/s) and its channels_last one 1.5 % (3676 -> 3730), the ResNets' NHWC / NCHW gain fell from
# 1.31 to 1.17 (RTX 4090, PyTorch 2.4: 1.21). gpemu emulates a current PyTorch, so a 16-bit NCHW forward convolution
# pays no transposes; the backward keeps them (no published NCHW / NHWC pair of cuDNN 9 training steps). Priced so,
# the 2024-2025 NCHW inference rows (38 architectures each) moved from -10.4 / -24.3 / -24.8 / -9.7 % (signed median:
# RTX 3090, 4090 twice, 5090) to -1.0 / -7.4 / -10.5 / +1.8 %, and the NHWC / NCHW ratio errors from 8.9 / 10.5 % to
# 5.0 / 7.9 % (median); the ResNets' ratio is now 1.07 where 1.17-1.21 is published: the NCHW-native kernels are
# somewhat slower than the NHWC ones, which this does not model. timm's 2022 NCHW inference rows (cuDNN 8.3) read
# 15 % fast now (signed median), as they should under this rule. Half the transpose traffic was tried: ResNet ratios
# 1.24-1.28 and NCHW rows 6-19 % slow.
def native_conv_layout(spec: GPUSpec, dtype: str, tensor_core: bool) -> int:
    """Return the layout cuDNN's convolution kernels for this dtype on `spec` natively use: LAYOUT_NHWC for 16-bit
    tensor cores, LAYOUT_NCHW for CUDA cores, LAYOUT_NONE (either, no transposes) for TF32 (Note [Layout cost])."""
    if dtype in ("fp16", "bf16") and tensor_core and has_tensor_cores(spec) and spec.peak_tflops.get(dtype, 0.0):
        return LAYOUT_NHWC
    if dtype in ("fp32", "tf32") and spec.peak_tflops.get("tf32", 0.0) > 0:  # TF32 convolutions (Note [Time model])
        return LAYOUT_NONE  # also on Hopper: Note [NCHW convolutions on Hopper]
    return LAYOUT_NCHW


def transposed_tensors(spec: GPUSpec, dtype: str, tensor_core: bool, layout: int, backward: bool) -> int:
    """Return how many activation tensors cuDNN transposes around a convolution in `layout` (LAYOUT_NCHW or
    LAYOUT_NHWC): 0 in its kernels' native layout, else 2 forward (x, y) or 3 backward (dy, x, dx), and 0 for a 16-bit
    NCHW forward (Note [Layout cost], Note [NCHW forward on cuDNN 9])."""
    native = native_conv_layout(spec, dtype, tensor_core)
    if native == LAYOUT_NONE or layout == native:
        return 0
    if backward:
        return 3
    return 0 if native == LAYOUT_NHWC and not is_hopper(spec) else 2  # Note [NCHW convolutions on Hopper]


# Note [NCHW convolutions on Hopper]
# Note [NCHW forward on cuDNN 9]'s transpose-free 16-bit NCHW forward rests on Ampere and Ada rows. On Hopper it does
# not hold: an H200 with cuDNN 9.19 (bench/data/h200-2026-11-27/micro.csv, ResNet-50's convolutions at batch 128,
# fp16) ran the 3x3 forwards 1.7-3.0x slower in NCHW than in channels_last (64ch at 56x56: 167 against 69 us; 512ch
# at 7x7: 81 against 48 us), the 7x7 stem 2.3x, and two small-spatial 1x1 ones 2.8-3.0x, as cuDNN 8 did everywhere;
# the 1x1 convolutions at 28x28 and above ran the same in both. So on compute capability 9.x a 16-bit NCHW forward
# pays its two transposes again (x in, y out). Lambda's H100 AMP resnet50 rows (NCHW, cuDNN 8; bench/
# published_validation.py), no part of this, moved from +21.4 / +40.8 % (PCIe / SXM, + = gpemu too fast) to +9.1 /
# +26.8 %. The H200's TF32 NCHW convolutions were 1.6-2.0x slower than channels_last too, but pricing them so (TF32
# NHWC-native on Hopper) took Lambda's H100 TF32 rows from -5.7 / +4.8 % to -27.6 / -19.1 %: conflicting evidence,
# so TF32 stays layout-neutral (Note [Layout cost]).
def is_hopper(spec: GPUSpec) -> bool:
    """Return True on Hopper (compute capability 9.x): NHWC-only cuDNN tensor-core convolutions (Note [NCHW
    convolutions on Hopper]) and fp32 GEMMs at 0.75 of peak (Note [FP32 GEMMs on Hopper])."""
    return spec.compute_capability[0] == 9


STREAM_CATEGORIES = frozenset({"elementwise", "norm", "reduction", "copy"})


# Note [16-bit streaming]
# The memory efficiencies m_c (and the per-GPU b) are fitted on fp32 steps whose convolutions run on CUDA cores at
# e_conv / e_conv_bwd, and only the sum is measured: the fit's split between a convolution and the batch norm or
# ReLU beside it is not physical (e_conv_bwd = 2.16 "Winograd" beside m_norm_bwd = 0.28 of bandwidth). Inside that
# fp32 world the split cancels; once the convolutions and GEMMs are priced on tensor cores from published GEMM
# throughputs (Note [Tensor-core efficiency]), the memory side must be physical too, or the fp32 fit's slow batch
# norm is left standing beside a fast tensor-core convolution (resnet50 AMP was predicted 15-25 % too slow on V100
# and A100 that way, the BERT/GPT-2 layers 20-35 % on V100). So a 16-bit op of a streaming category (elementwise,
# norm, reduction, copy) is priced at m_stream of the datasheet bandwidth, no per-GPU b:
#     memory_s = M / (bw * m_stream * r_bn) + mem_lat_cycles / clock        (r_bn: NCHW batch norm's plane ramp)
# m_stream is fitted on published streaming-kernel bandwidths of four GPUs (bench/published_validation.py,
# leave-one-out) and validated on whole published steps. Pooling, embedding and optimizer kernels keep the fitted
# m_c, and so does every fp32 op: fp32 predictions do not change. (Tried and dropped: streaming fp32 ops too on GPUs
# whose fp32 convolutions run on TF32. The one published TF32 step, resnet50 on an A100, went from 15 % too slow to
# 15 % too fast: no evidence either way, so the fp32 world stays as calibrated.)
def streams_physically(spec: GPUSpec, dtype: str, m_stream: float) -> bool:
    """Return True when a streaming op of `dtype` on `spec` is priced at m_stream (Note [16-bit streaming]):
    16-bit ops, on any GPU."""
    return m_stream > 0 and dtype in ("fp16", "bf16")


# Note [Row norms stream]: layer norm, softmax and log-softmax (and their backwards) are one-pass row kernels: read
# x (and dy), write y. Under autocast they run in fp32 beside tensor-core GEMMs (autocast's fp32 list), and a
# language model's loss upcasts its logits (GPT-2: 8192 x 50257 fp32). They were priced with the fp32 CNN fit's
# "norm" efficiencies, whose split against the convolutions is not physical (Note [16-bit streaming]) and which the
# fit sets from batch norm (m_norm_bwd = 0.28 of bandwidth): GPT-2's log_softmax backward cost 5.4 ms on an A100 for
# 4.9 GB moved. The torchvision CNNs of the fit have no such op but the loss's log_softmax over B x 1000 logits, so
# they are priced at m_stream in every float dtype, as the published vector kernels m_stream is fitted on
# (fp32 `a * 1.2`) are.
ROW_NORM_OPS = frozenset({"native_layer_norm", "native_layer_norm_backward", "_softmax", "_softmax_backward_data",
                          "_log_softmax", "_log_softmax_backward_data"})


def streams(spec: GPUSpec, dtype: str, category: str, name: str, m_stream: float) -> bool:
    """Return True when an op is priced at m_stream of the datasheet bandwidth (Note [16-bit streaming], Note [Row
    norms stream])."""
    if category not in STREAM_CATEGORIES:
        return False
    if name in ROW_NORM_OPS:
        return m_stream > 0 and dtype in ("fp32", "fp16", "bf16")
    return streams_physically(spec, dtype, m_stream)


def spec_columns(ops: OpArrays, spec: GPUSpec, tc_eff: float, m_stream: float = 0.0) -> SpecColumns:
    """Return the GPU-dependent per-op constants for `ops` on `spec` (`tc_eff`: Note [Tensor-core efficiency];
    `m_stream`: Note [16-bit streaming], 0 = off)."""
    cache: dict[tuple[str, str, bool, int], tuple[float, bool]] = {}
    n = len(ops.names)
    peaks, on_tc = np.empty(n), np.zeros(n, dtype=bool)
    aligns = ops.gemm_align.tolist() if ops.gemm_align is not None else [8] * n
    for i, (cat, dt, tc, al) in enumerate(zip(ops.category, ops.dtype, ops.tensor_core.tolist(), aligns, strict=True)):
        key = (cat, dt, tc, int(al))
        if key not in cache:
            cache[key] = (peak_flops(spec, dt, cat, tc, int(al)), uses_tensor_cores(spec, dt, cat, tc))
        peaks[i], on_tc[i] = cache[key]
    mem = np.array([_MEM_IDX[mem_param(c, bool(ph))] for c, ph in zip(ops.category, ops.phase, strict=True)])
    plane = ops.plane if ops.plane is not None else np.full(n, np.inf)
    relayout = np.zeros(n)
    if ops.layout is not None and ops.layout.any():  # See Note [Layout cost]
        nhwc_bn = (ops.layout == LAYOUT_NHWC) & np.isfinite(plane)
        plane = np.where(nhwc_bn, np.inf, plane)
        moved = ops.relayout_at_batch(1.0) > 0  # convolutions (their activation bytes)
        for j in np.flatnonzero((ops.layout != LAYOUT_NONE) & moved):
            if ops.category[j] == "conv":
                relayout[j] = transposed_tensors(spec, ops.dtype[j], bool(ops.tensor_core[j]), int(ops.layout[j]),
                                                 ops.names[j].endswith("_backward"))
    pointwise = ops.pointwise if ops.pointwise is not None else np.zeros(n, dtype=bool)
    lowered = np.array([lowered_conv(spec, d, c) for c, d in zip(ops.category, ops.dtype, strict=True)], dtype=bool)
    compute_param = np.array([compute_param_index(c, name, bool(pw) or bool(lw)) for c, name, pw, lw in
                              zip(ops.category, ops.names, pointwise, lowered, strict=True)], dtype=np.int64)
    staged = staged_conv(compute_param, on_tc)
    mem = np.where(staged, np.where(ops.phase > 0, _MEM_IDX["m_conv_bwd"], _MEM_IDX["m_conv"]), mem)
    staged = staged | lowered  # See Note [bf16 convolutions before Ampere]: stages, at the elementwise efficiency
    out_channels = ops.out_channels if ops.out_channels is not None else np.zeros(n)
    stream = np.array([streams(spec, d, c, name, m_stream)
                       for c, d, name in zip(ops.category, ops.dtype, ops.names, strict=True)], dtype=bool)
    channel_per_byte = ops.channel_per_byte if ops.channel_per_byte is not None else np.zeros(n)
    return SpecColumns(
        peak=peaks,
        tensor_core=on_tc,
        tc_eff=tc_eff,
        fused_attention=on_tc & np.array([c == "attention" for c in ops.category], dtype=bool),
        attention_eff=fused_attention_eff(spec, tc_eff) * (
            ops.attn_scale if ops.attn_scale is not None and warpgroup_gemms(spec) else np.ones(n)),
        stream=stream,
        m_stream=m_stream,
        relayout_stream=(relayout > 0) & np.array([streams_physically(spec, d, m_stream) for d in ops.dtype],
                                                  dtype=bool),
        is_kernel=np.array([c != "view" for c in ops.category]),
        compute_param=compute_param,
        mem_param=mem,
        plane=plane,
        relayout=relayout,
        staged=staged,
        group_width=np.where(np.isin(compute_param, (2, 3)) & ~on_tc, ops.group_width, 1.0) if (
            ops.group_width is not None) else np.ones(n),
        column_bytes_per_flop=np.where(lowered, column_bytes_per_flop(out_channels), 0.0),
        kernels_per_sample=np.array([lowered_kernels_per_sample(name, bool(pw)) if lw else 0.0 for name, pw, lw in
                                     zip(ops.names, pointwise, lowered, strict=True)], dtype=np.float64),
        bw=spec.load_memory_bw_gbps * 1e9,  # See Note [Sustained clock]
        sm_count=spec.sm_count,
        clock_hz=spec.load_clock_mhz * 1e6,
        tc_conv=on_tc & np.isin(compute_param, CONV_COMPUTE_PARAMS),
        row_ramp=row_ramps(ops.row_len, ops.names, spec) if ops.row_len is not None else np.ones(n),
        channel_cycles_per_byte=channel_per_byte / np.array([bn_channel_rate(name) for name in ops.names]),
        channel_floor_bytes=np.array([BN_SINGLE_READ_BYTES / (cpb * _ELEM_BYTES.get(d, 4)) if cpb > 0 else np.inf
                                      for cpb, d in zip(channel_per_byte, ops.dtype, strict=True)]),
        pool_cycles_per_flop=np.array([1.0 / (pool_rate(name) * spec.sm_count) if issue_bound_pool(c, name) else 0.0
                                       for c, name in zip(ops.category, ops.names, strict=True)]),
    )


def _t(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)


# Note [Batch-norm plane size]
# cuDNN's NCHW batch norm reduces each channel over N planes of H*W contiguous elements. Large planes (VGG's 224x224)
# stream at full speed; small ones (7x7 = 196 bytes at the end of a ResNet) are short, poorly coalesced segments
# and per-plane reduction overhead. So a batch-norm op's memory efficiency ramps with its plane size P:
#     m_eff = m_norm * P / (P + bn_plane_half)
# bn_plane_half (elements) is fitted and shared by every GPU. Without it the single per-byte batch-norm cost was set
# by the ResNets' and DenseNets' small planes and overpriced the VGG-BN models' big ones (their backward predicted
# 40-55 % too slow in-sample, vs 20-30 % for the same VGGs without batch norm).
def plane_efficiency(plane: Any, half: Any) -> torch.Tensor:
    """Return P / (P + half) per op (1 where P is inf): the batch-norm plane-size ramp, Note [Batch-norm plane size]."""
    plane_t = torch.as_tensor(plane, dtype=torch.float64)
    return 1.0 / (1.0 + _t(half) / plane_t)


# Note [Layer-norm row length]
# A layer norm reduces each row of its normalised (last) dimension; a short row leaves most of a thread block idle
# and the kernel far from the bandwidth a long one reaches. An H200 (bench/data/h200-2026-11-27, torch.profiler
# kernel times of ViT-B/16, Swin-T, ConvNeXt-T, BERT-base and GPT-2 at batch 16-64, fp32 and AMP alike: autocast runs
# layer norm in fp32) streamed the forward at 490 / 866 / 1,470 / 1,810-2,040 / 2,650 GB/s for rows of 96 / 192 /
# 384 / 768 / 1,536 elements: R / (R + 590) of one ceiling within 10 % everywhere, and the backward the same way (447
# / 783 / 1,190-1,380 / 1,680 GB/s from 192 elements; its 96-element row ran faster, another kernel). The op-level
# check had layer norm 3-4x faster than the card (bench/op_validation.py: 0.22-0.31 of the measured time). So a
# layer norm's memory efficiency carries the factor R / (R + LAYER_NORM_ROW_HALF), R the last dimension, on every
# GPU: the mechanism is the kernel's, not Hopper's; the constant is the H200's. Softmax and group norm keep theirs
# (no measurement). Session 13: what a short row wastes is a block's fixed per-row cycles, against the data its SM
# would stream meanwhile, so the half-way row length scales with the GPU's bandwidth per SM cycle (the H200: 18.4
# bytes; an RTX 4090: 3.1, half-way at 100 elements; an A100: 13.4, at 430). With the H200's 590 on every GPU, timm's
# published AMP inference rows of the layer-norm models went 20-30 points slower than measured on the RTX boards
# (session 12; vit_tiny on an RTX 4090 +16 -> -14 %, convnext_tiny -14 -> -35 %); scaled, the 4090's PyTorch 2.4 NCHW
# rows are 10.7 / 28.2 % (median / p90; 13.4 / 40.8 with 590, 8.8 / 24.4 before session 12). The backward keeps the
# H200's constant: on the H200 itself it is still priced at 0.47-0.68 of the measured time for rows of 192-768
# (its weight-gradient reduction is a second kernel the ramp does not describe), so a cheaper backward elsewhere has
# no support; scaling it too moved Lambda's BERT SQuAD rows from 12.0 to 13.0 % median (forward only: 12.4).
LAYER_NORM_ROW_HALF = 590.0
LAYER_NORM_REF_BYTES_PER_SM_CYCLE = 4.8e12 / (132 * 1.98e9)  # the H200's: 4.8 TB/s over 132 SMs at 1,980 MHz
_ROW_NORM_OPS = frozenset({"native_layer_norm", "native_layer_norm_backward"})


def row_ramps(row_len: np.ndarray, names: Sequence[str], spec: GPUSpec) -> np.ndarray:
    """Return each op's layer-norm row ramp on `spec` from its row length (1 where it has none: Note [Layer-norm row
    length])."""
    rows = np.asarray(row_len, dtype=np.float64)
    backward = np.array([n.endswith("_backward") for n in names], dtype=bool)
    half = np.where(backward, layer_norm_row_half(None), layer_norm_row_half(spec))  # the backward keeps the H200's
    return np.where(rows > 0, rows / (rows + half), 1.0)


def layer_norm_row_half(spec: GPUSpec | None) -> float:
    """Return the row length at which `spec`'s layer norms reach half their ceiling (Note [Layer-norm row length]):
    LAYER_NORM_ROW_HALF scaled by the GPU's bytes per SM cycle against the H200's (its value without a spec)."""
    if spec is None:
        return LAYER_NORM_ROW_HALF
    per_sm_cycle = spec.load_memory_bw_gbps * 1e9 / (spec.sm_count * spec.load_clock_mhz * 1e6)
    return LAYER_NORM_ROW_HALF * per_sm_cycle / LAYER_NORM_REF_BYTES_PER_SM_CYCLE


def layer_norm_row_ramp(name: str, shape: Sequence[int], spec: GPUSpec | None = None) -> float:
    """Return R / (R + half) for a layer norm over rows of R = shape[-1] elements on `spec`, else 1 (Note
    [Layer-norm row length]); the backward's first input is its grad_out, of the same shape."""
    if name not in _ROW_NORM_OPS or not shape:
        return 1.0
    row = float(shape[-1])
    half = layer_norm_row_half(None if name.endswith("_backward") else spec)
    return row / (row + half) if row > 0 else 1.0


# Note [Batch norm, one block per channel]
# cuDNN's NCHW training batch norm (its bn_fw_tr_1C11 / bn_bw_1C11 kernels: a grid of one block per channel) reduces
# each channel's N*H*W elements in one thread block, so an op with few channels and big planes runs on few SMs at a
# block's latency-bound pace whatever the bandwidth. An H200 (bench/data/h200-2026-11-27, torch.profiler kernel times,
# 422 training batch norms of 18 CNNs at batch 16 and 64) processed, per channel, 0.7-0.95 elements per SM cycle
# forward and 0.31-0.38 backward, in fp32 and fp16 alike (so elements, not bytes) and flat in the channel count up to
# 256, once a channel's data passed the single-read size (the kernels that hold a channel on chip and read it once:
# 64K fp16 elements ran 3x faster per channel than 200K); ResNet-50's first batch norm (64 channels of 112 x 112) at
# batch 64 ran at 350 GB/s in fp16, 7 % of the card's bandwidth, where the bandwidth model priced it at 0.11 of the
# measured time. So such an op takes at least
#     serial_s = N*H*W / (BN_CHANNEL_ELEMS_PER_CYCLE[_BWD] * clock) + mem_lat_cycles / clock
# when N*H*W * element size > BN_SINGLE_READ_BYTES, as a floor under its memory time. Priced in cycles, as memory
# latency is (Note [Memory latency]): the mechanism is the kernel's, the constants the H200's. It binds on
# high-bandwidth GPUs (A100, H100, H200: 2-4x the bandwidth price on a ResNet's first stages) and hardly on GPEmu's
# five GPUs (the floor is at or under their fitted fp32 batch-norm price). NHWC batch norm (other kernels) and
# eval-mode batch norm (no reduction) have no floor. Per op on the H200 (bench/op_validation.py, 18 models at batch
# 64, summed kernel time per step, gpemu / measured): training batch norm AMP 0.58 / 0.45 (fwd / bwd) -> ~1.06.
BN_CHANNEL_ELEMS_PER_CYCLE = 0.8
BN_CHANNEL_ELEMS_PER_CYCLE_BWD = 0.35
BN_SINGLE_READ_BYTES = 128 * 1024
_ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "fp64": 8}


def bn_channel_rate(name: str) -> float:
    """Return the elements per SM cycle one channel's block of a batch norm processes (Note [Batch norm, one block
    per channel]): the backward's rate for its backward ops, else the forward's."""
    return BN_CHANNEL_ELEMS_PER_CYCLE_BWD if name.endswith("_backward") else BN_CHANNEL_ELEMS_PER_CYCLE


def channel_elems_per_byte(channel_elems: float, nbytes: float) -> float:
    """Return a batch norm's per-channel elements per byte it moves (0 for other ops): batch-independent, as both
    grow with N (Note [Batch norm, one block per channel])."""
    return channel_elems / nbytes if channel_elems > 0 and nbytes > 0 else 0.0


def past_single_read(channel_elems: Any, dtype: str) -> Any:
    """Return True where one channel's data (N*H*W elements of `dtype`) is past what the single-read kernels hold on
    chip, so the one-block-per-channel floor applies (Note [Batch norm, one block per channel])."""
    return channel_elems * _ELEM_BYTES.get(dtype, 4) > BN_SINGLE_READ_BYTES


# Note [Pooling kernels are issue-bound]
# PyTorch's NCHW pooling kernels do index arithmetic per element (window bounds, the argmax index a max-pool
# backward matches against) and run far below the bandwidth: torch.profiler kernel times of 18 CNNs at batch 64
# (bench/data/h200-2026-11-27 and bench/data/h100-2026-11-28, 136 pooling ops per card, fp32 and AMP) show each op
# taking the same time on an H100 as on an H200 (ratio 1.00: same SMs and clock, 1.43x less bandwidth on the H100)
# and in fp32 as in fp16, at a steady rate of elements per SM cycle over the whole GPU (median, p25-p75):
#     max-pool forward        0.235 outputs   (0.228-0.241)     max-pool backward   0.34 grad-input elements
#     avg-pool forward        0.285 outputs   (0.277-0.299)     avg-pool backward   0.13 (3x3 stride 1) / 0.22 (2x2)
#     adaptive avg forward / backward  0.063
# They were priced by bytes at the fitted "other" ceiling (0.37 / 0.11 of the bandwidth: a catch-all fitted on
# GPEmu's phase totals), 1.4-2.3x over the H100's kernel time in fp32 and 1.43x apart on the two cards. A pooling
# forward now takes at least
#     issue_s = counted elements / (rate * SMs * clock) + mem_lat_cycles / clock
# over its bytes streamed at the elementwise ceiling. Counted elements are the op's cost.flops (the numel of what it
# writes: a max-pool forward writes values and indices, so its rate is twice the outputs' per cycle). The rates are
# one Hopper die's; per SM cycle they carry across GPUs as memory latency does (Note [Memory latency]). For the
# forwards, leave-one-GPU-out on GPEmu's five GPUs agrees (forward p90 20.4 -> 20.0 %, docs/cost-model.md, session
# 16); for the backwards it does not (backward 6.6 / 19.5 -> 8.2 / 22.1 %: the fitted per-byte price is what their
# phase totals hold, torch <= 1.9's kernels on Kepler to Volta), so pooling backwards keep the bytes at the fitted
# "other" ceiling (their measured rates above stay in this Note until per-op data of an older GPU says how they
# carry).
POOL_ELEMS_PER_SM_CYCLE: dict[str, float] = {
    "max_pool2d_with_indices": 0.47, "max_pool3d_with_indices": 0.47, "adaptive_max_pool2d": 0.47,
    "max_pool2d": 0.235, "avg_pool2d": 0.285, "avg_pool1d": 0.285, "avg_pool3d": 0.285,
    "_adaptive_avg_pool2d": 0.063, "_adaptive_avg_pool3d": 0.063,
}  # fmt: skip
POOL_DEFAULT_ELEMS_PER_SM_CYCLE = 0.235


def issue_bound_pool(category: str, name: str) -> bool:
    """Return True for a pooling op priced at its issue rate (Note [Pooling kernels are issue-bound]): forwards."""
    return category == "pooling" and not name.endswith("_backward")


def pool_rate(name: str) -> float:
    """Return a pooling op's counted elements per SM cycle over the GPU (Note [Pooling kernels are issue-bound])."""
    return POOL_ELEMS_PER_SM_CYCLE.get(name, POOL_DEFAULT_ELEMS_PER_SM_CYCLE)


# Note [Group width]
# A grouped convolution with g input channels per group is g-wide GEMMs side by side. At g = 1 (depthwise: MobileNets,
# ShuffleNets, MNASNet, EfficientNet, ConvNeXt) cuDNN runs direct, bandwidth-starved kernels, at e_grouped[_bwd] of
# the peak (fitted ~0.16 / ~0.09); as g grows the per-group GEMM fills the tiles of an implicit-GEMM kernel and the
# efficiency rises to that of a dense GEMM-like convolution, e_conv_1x1[_bwd] (no Winograd: the grouped kernels do
# not transform). With one e_grouped for every group width, ResNeXt-101 32x8d (g = 8 to 64) shared the depthwise
# efficiency: left out of the fit it was predicted 110 % off (median, fwd+bwd), and a RegNet (g = 8 to 528) came
# out ~3x slower than a ResNet of its FLOPs. Between the two ends, in log space:
#     log e(g) = log e_grouped + (log e_dense - log e_grouped) * (g - 1) / (g - 1 + group_width_half)
# group_width_half (channels per group at which the log efficiency is half way) is fitted and shared; only
# ResNeXt-101 in the data has g > 1, so a fit without it keeps the prior of 16 (half the 32-wide rows of a typical
# implicit-GEMM tile). Depthwise convolutions (g = 1) are priced as before.
def group_efficiency(e_grouped: Any, e_dense: Any, group_width: Any, half: Any) -> torch.Tensor:
    """Return a grouped convolution's compute efficiency at `group_width` input channels per group (Note [Group
    width])."""
    g = torch.as_tensor(group_width, dtype=torch.float64)
    r = (g - 1.0) / (g - 1.0 + _t(half))
    lo, hi = torch.log(_t(e_grouped)), torch.log(_t(e_dense))
    return torch.exp(lo + (hi - lo) * r)


def kernel_seconds(flops: Any, nbytes: Any, cols: SpecColumns, p: dict[str, Any], f: dict[str, Any],
                   relayout_bytes: Any = None, conv_batch: Any = None) -> torch.Tensor:
    """Return per-op GPU kernel seconds as a float64 tensor (`p` shared params, `f` per-GPU factors; floats or
    tensors, so the calibration can differentiate through it). `relayout_bytes` (conv activation bytes, same shape as
    `nbytes`) prices layout transposes where cols.relayout says so (Note [Layout cost]); `conv_batch` (convolutions'
    samples, same shape) the per-sample kernels of lowered convolutions (Note [bf16 convolutions before Ampere])."""
    flops, nbytes = _t(flops), _t(nbytes)
    e = torch.stack([_t(p[k]) for k in COMPUTE_PARAMS])
    m = torch.stack([_t(p[k]) for k in MEMORY_PARAMS])
    e_op = e[torch.as_tensor(np.maximum(cols.compute_param, 0))]
    m_ceiling = m[torch.as_tensor(cols.mem_param)]
    ramp = plane_efficiency(cols.plane, p["bn_plane_half"]) * torch.as_tensor(cols.row_ramp)
    m_op = m_ceiling * f["b"] * ramp
    if cols.stream.any():  # See Note [16-bit streaming]
        m_op = torch.where(torch.as_tensor(cols.stream), cols.m_stream * ramp, m_op)
    if (cols.group_width > 1).any():  # See Note [Group width]
        wide = torch.as_tensor(cols.group_width > 1)
        dense = e[torch.as_tensor(np.where(cols.compute_param == 3, 6, 5))]  # e_conv_1x1 / e_conv_1x1_bwd
        e_op = torch.where(wide, group_efficiency(e_op, dense, cols.group_width, p["group_width_half"]), e_op)
    has_compute = torch.as_tensor(cols.compute_param >= 0)
    eff = e_op * f["a"]
    if cols.tensor_core.any():  # See Note [Tensor-core efficiency]
        tc = torch.where(torch.as_tensor(cols.fused_attention), torch.as_tensor(cols.attention_eff, dtype=torch.float64),
                         torch.as_tensor(cols.tc_eff, dtype=torch.float64))  # Note [Fused attention efficiency]
        if cols.tc_conv.any():  # See Note [Tensor-core convolution factor]
            tc = torch.where(torch.as_tensor(cols.tc_conv), tc * f["t"], tc)
        eff = torch.where(torch.as_tensor(cols.tensor_core), tc, eff)
    compute = (flops + p["w_half"] * cols.sm_count) / (torch.as_tensor(cols.peak) * eff)
    compute = torch.where(has_compute, compute, torch.zeros_like(compute))
    latency = p["mem_lat_cycles"] / cols.clock_hz
    if cols.column_bytes_per_flop.any():  # See Note [bf16 convolutions before Ampere]
        nbytes = nbytes + flops * torch.as_tensor(cols.column_bytes_per_flop)
    memory = nbytes / (cols.bw * m_op) + latency
    if cols.channel_cycles_per_byte.any():  # See Note [Batch norm, one block per channel]
        serial = nbytes * torch.as_tensor(cols.channel_cycles_per_byte) / cols.clock_hz + latency
        past = nbytes > torch.as_tensor(cols.channel_floor_bytes)
        memory = torch.where(past, torch.maximum(memory, serial), memory)
    if cols.pool_cycles_per_flop.any():  # See Note [Pooling kernels are issue-bound]
        issue = flops * torch.as_tensor(cols.pool_cycles_per_flop) / cols.clock_hz + latency
        memory = torch.where(torch.as_tensor(cols.pool_cycles_per_flop > 0), torch.maximum(memory, issue), memory)
    body = torch.maximum(compute, memory)
    if cols.staged.any():  # See Note [Staged convolutions]
        body = torch.where(torch.as_tensor(cols.staged), compute + memory, body)
    body = body + p["k0"]
    if conv_batch is not None and cols.kernels_per_sample.any():  # See Note [bf16 convolutions before Ampere]
        launches = torch.clamp(torch.as_tensor(cols.kernels_per_sample) * _t(conv_batch) - 1.0, min=0.0)
        body = body + launches * (latency + p["k0"])
    if relayout_bytes is not None and cols.relayout.any():
        relayout = torch.as_tensor(cols.relayout)
        m_copy = m[torch.as_tensor(np.where(cols.relayout > 0, _relayout_param(cols), 0))] * f["b"]
        if cols.relayout_stream.any():  # See Note [16-bit streaming]
            m_copy = torch.where(torch.as_tensor(cols.relayout_stream), cols.m_stream, m_copy)
        body = body + torch.where(relayout > 0, 2 * _t(relayout_bytes) / (cols.bw * m_copy)
                                  + relayout * (latency + p["k0"]), torch.zeros_like(body))
    return torch.where(torch.as_tensor(cols.is_kernel), body, torch.zeros_like(body))


def _relayout_param(cols: SpecColumns) -> np.ndarray:
    """Return, per op, the MEMORY_PARAMS index a layout transpose streams at: elementwise of the op's phase."""
    bwd = np.isin(cols.mem_param, [_MEM_IDX[k] for k in MEMORY_PARAMS if k.endswith("_bwd")])
    return np.where(bwd, _MEM_IDX["m_elementwise_bwd"], _MEM_IDX["m_elementwise"])


def compress_views(ops: OpArrays) -> OpArrays:
    """Return `ops` without view ops, each kernel op carrying how many views preceded it (same phase time: views
    add host time only; trailing views of a phase are dropped)."""
    is_view = np.array([c == "view" for c in ops.category])
    keep = np.flatnonzero(~is_view)
    counts = np.cumsum(is_view)[keep]
    before = np.diff(np.concatenate([[0], counts])) + (ops.views_before[keep] if ops.views_before is not None else 0)
    out = ops.pick(keep)
    out.views_before = before.astype(np.float64)
    return out


def host_seconds(ops: OpArrays, p: dict[str, Any], f: dict[str, Any]) -> torch.Tensor:
    """Return each op's host dispatch seconds: h (forward) or h_bwd (loss/backward/step) per kernel op, h_view per
    view op (or per folded view, see compress_views)."""
    kern = torch.as_tensor(np.array([c != "view" for c in ops.category]), dtype=torch.float64)
    fwd = torch.as_tensor(ops.phase == 0, dtype=torch.float64)
    per_kernel = fwd * _t(p["h"]) + (1 - fwd) * _t(p["h_bwd"])
    views = torch.as_tensor(ops.views_before) if ops.views_before is not None else 1 - kern
    return (kern * per_kernel + views * _t(p["h_view"])) * f["c"]


def phase_seconds(kernel_s: torch.Tensor, host_s: torch.Tensor, p: dict[str, Any], phase: str) -> torch.Tensor:
    """Return one phase's seconds for ops in launch order: t0 + max_j(H_j + sum_{k>=j} d_k). See Note [Time model].

    `kernel_s` may carry leading batch dimensions (last axis = ops); `host_s` is each op's host seconds.
    """
    host_cum = torch.cumsum(host_s, -1)
    tail = torch.flip(torch.cumsum(torch.flip(kernel_s, (-1,)), -1), (-1,))
    t0 = p["t0"] if phase == "forward" else p["t0_bwd"]
    return (host_cum + tail).max(-1).values + t0
