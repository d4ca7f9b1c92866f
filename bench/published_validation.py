"""Compare gpemu's predictions with published real-GPU throughputs for GPUs, dtypes and layouts not in ../shared.

Usage: .venv/bin/python bench/published_validation.py [--json] [--write]

Every reference below is a number a third party measured on real hardware and published; each row names where.
Four tables:
  1. GEMM: published large-matmul TFLOPS (tensor cores). The one constant fitted here, tc_eff (Note [Tensor-core
     efficiency] in gpemu/cost/model.py), is fitted on these rows; each row's leave-one-out error (tc_eff fitted
     on the other rows) is printed, and the all-rows fit is what src/gpemu/cost/fitted.json carries.
  2. Transformer layers (bench/_transformer_layers.py): best TFLOPS over a published batch x sequence grid.
  3. Whole models (img/s): `predict_phase` on the spec path, forward + backward (GPEmu's "backward" = loss +
     zero_grad + backward + optimizer step) for training, forward for inference; NHWC rows are predicted with
     memory_format="channels_last".
  4. Lambda's deeplearning-benchmark (session 8): 1-GPU resnet50 training img/s (as table 3; Note [Lambda resnet50
     rows]) and BERT-base/large SQuAD fine-tuning sequences/s (bench/_bert_squad.py) on 12 GPUs, Volta to Hopper,
     with errors per dtype and per GPU generation.
Tables 2 to 4 are not used by any fit. Caveats the tables cannot hide: NVIDIA's numbers are whole pipelines (DALI
data loading, their training script); inference rows are priced as gpemu's "inference" phase (model.eval() under
torch.no_grad(): Note [Inference forward] in gpemu/workloads/optrace.py; until session 10 they were priced as
training-mode forwards). Prints errors, not verdicts.
--write stores the errors of the 16-bit / TF32 whole-model rows (tables 3 and 4) and of the layer and SQuAD rows in
src/gpemu/cost/expected_error.json (Note [Expected error] in gpemu/cost/expected_error.py): no measured row in
../shared/data has tensor cores, so these are what `gpemu predict` shows beside a tf32/fp16/bf16/amp figure.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from gpemu.cost.expected_error import EXPECTED_ERROR_PATH, fitted_sha256, published_by_gpu_entries
from gpemu.cost.model import CostParams, load_params, peak_flops
from gpemu.cost.predict import predict_phase
from gpemu.cost.registry import OpCost
from gpemu.cost.roofline import cost_time_s
from gpemu.hardware import get_gpu

DLE = "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md (pytorch-21.03 NGC)"
DLE_CFG = "batch sizes from PyTorch/Classification/ConvNets/configs.yml"
DLE1910 = ("NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md at 3bbe228 "
           "(pytorch-19.10 NGC, APEX AMP, NCHW; --amp default batch 256)")
SKB = "sandeepkumar-skb/pytorch_experiments torchvision_exp/README.md (torchvision resnet50, batch 128)"
MLI = ("mli/transformers-benchmarks README.md 'Micro-Benchmarking Summary' (micro_bench.ipynb: square n=8192 "
       "matmul, NGC pytorch:22.07, whose fp32 matmul runs TF32)")
MAMF = ("stas00/ml-engineering compute/accelerator/README.md 'Maximum Achievable Matmul FLOPS comparison table', "
        "BF16 (mean of 100 iterations at the best shape found)")
MAG = "mag-/gpu_benchmark README.md 'Stats' (mamf-finder with optuna, best shape)"
MLI4090 = ("mli/transformers-benchmarks README.md @ 3370b2b3 'Micro-Benchmarking Summary' (micro_bench.ipynb: square "
           "n=8192 matmul; 'Matrix Multiplication FP32 / FP16' row, FP32 = TF32)")


@dataclass(frozen=True)
class GemmReference:
    """One published matmul throughput: TFLOPS of an (m x k) @ (k x n) product on a GPU."""

    gpu: str
    dtype: str  # fp16, bf16, tf32 (tensor cores) or fp32 (CUDA cores: a check, never in the fit)
    m: int
    n: int
    k: int
    tflops: float
    source: str


GEMMS: tuple[GemmReference, ...] = (
    GemmReference("v100-sxm2-32gb", "fp16", 8192, 8192, 8192, 95.0, f"{MLI}, V100 16GB"),
    GemmReference("a100-sxm4-80gb", "fp16", 8192, 8192, 8192, 230.0, f"{MLI}, A100 80GB"),
    GemmReference("a100-sxm4-80gb", "tf32", 8192, 8192, 8192, 116.0, f"{MLI}, A100 80GB"),
    GemmReference("a100-sxm4-80gb", "bf16", 1024, 10240, 5120, 271.2, f"{MAMF}, A100 SXM, torch 2.6.0+cu126"),
    GemmReference("a100-pcie-40gb", "bf16", 2048, 5120, 6144, 252.9, f"{MAMF}, A100 PCIe, torch 2.5.1+cu124"),
    GemmReference("h100-sxm5-80gb", "bf16", 2048, 2048, 13312, 794.5, f"{MAMF}, H100 SXM, torch 2.7.0+cu126"),
    GemmReference("h100-pcie-80gb", "bf16", 6912, 16384, 2048, 499.5, f"{MAG}, H100 PCIe"),
    GemmReference("b200", "bf16", 1792, 16128, 3072, 1745.0, f"{MAMF}, B200 SXM, torch 2.7.1+cu128"),
    GemmReference("rtx-a6000", "fp16", 8192, 8192, 8192, 95.0, f"{MLI4090}, A6000"),
    GemmReference("rtx-a6000", "tf32", 8192, 8192, 8192, 60.0, f"{MLI4090}, A6000"),
    # half-rate tensor cores (Note [Half-rate tensor cores]): fit tc_eff_half_rate, not tc_eff
    GemmReference("rtx4090", "fp16", 8192, 8192, 8192, 172.0, f"{MLI4090}, 4090"),
    GemmReference("rtx4090", "tf32", 8192, 8192, 8192, 86.0, f"{MLI4090}, 4090"),
    GemmReference("v100-sxm2-32gb", "fp32", 8192, 8192, 8192, 14.0, f"{MLI}, V100 16GB (CUDA cores)"),
)
@dataclass(frozen=True)
class StreamReference:
    """One published streaming-kernel bandwidth: `a * 1.2` on a large fp32 vector (read + write, 8 bytes/element)."""

    gpu: str
    datasheet_gbps: float  # the GPU's datasheet memory bandwidth (the two not in gpemu's catalog are named here)
    tflops: float  # as published: elements per second / 1e12
    source: str

    @property
    def efficiency(self) -> float:
        """Return achieved / datasheet bandwidth."""
        return self.tflops * 1e12 * 8 / 1e9 / self.datasheet_gbps


MLI_VEC = "mli/transformers-benchmarks README.md 'VectorMul' (micro_bench.ipynb: a * 1.2, 4 Mi fp32 elements)"
STREAMS: tuple[StreamReference, ...] = (
    StreamReference("a100-sxm4-80gb", 2039.0, 0.202, f"{MLI_VEC}, A100 80GB"),
    StreamReference("rtx-a6000 (768 GB/s, not in the catalog)", 768.0, 0.082, f"{MLI_VEC}, A6000"),
    StreamReference("v100-sxm2-32gb", 900.0, 0.098, f"{MLI_VEC}, V100 16GB"),
    StreamReference("rtx-3090-ti (1008 GB/s, not in the catalog)", 1008.0, 0.107, f"{MLI_VEC}, 3090 Ti"),
)


def fit_m_stream(refs: Sequence[StreamReference]) -> float:
    """Return m_stream fitted on streaming rows: the geometric mean of their efficiencies (Note [16-bit
    streaming])."""
    return math.exp(sum(math.log(r.efficiency) for r in refs) / len(refs))


_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4}


def _gemm_cost(ref: GemmReference) -> OpCost:
    flops = 2 * ref.m * ref.n * ref.k
    nbytes = (ref.m * ref.k + ref.k * ref.n + ref.m * ref.n) * _ELEMENT_BYTES[ref.dtype]
    return OpCost(flops, nbytes, "matmul", ref.dtype, tensor_core=True)


def predicted_gemm_tflops(ref: GemmReference, params: CostParams) -> float:
    """Return gpemu's predicted TFLOPS for one GEMM reference (the fitted op model, Note [Time model])."""
    cost = _gemm_cost(ref)
    return cost.flops / cost_time_s(cost, "mm", get_gpu(ref.gpu), params) / 1e12


def implied_tc_eff(ref: GemmReference, params: CostParams) -> float:
    """Return the tc_eff at which the model's compute time equals the published one: (F + w_half * SMs) /
    (peak * (t - k0)), t = F / published FLOP/s (the rows are compute-bound; the bench checks that)."""
    spec, cost = get_gpu(ref.gpu), _gemm_cost(ref)
    t = cost.flops / (ref.tflops * 1e12) - params.shared["k0"]
    return (cost.flops + params.shared["w_half"] * spec.sm_count) / (peak_flops(spec, ref.dtype, "matmul", True) * t)


def fit_tc_eff(refs: Sequence[GemmReference], params: CostParams) -> float:
    """Return tc_eff fitted on tensor-core GEMM rows: the geometric mean of their implied efficiencies."""
    logs = [math.log(implied_tc_eff(r, params)) for r in refs if r.dtype != "fp32"]
    return math.exp(sum(logs) / len(logs))


def _half_rate(ref: GemmReference) -> bool:
    return get_gpu(ref.gpu).half_rate_tensor


def fit_rows_of(half_rate: bool) -> list[GemmReference]:
    """Return the tensor-core GEMM rows that fit tc_eff (half_rate False) or tc_eff_half_rate (True)."""
    return [r for r in GEMMS if r.dtype != "fp32" and _half_rate(r) == half_rate]


def gemm_rows(params: CostParams) -> list[dict[str, object]]:
    """Return one dict per GEMM reference with the packaged prediction and the leave-one-out one (the efficiency
    of its class, full- or half-rate tensor cores, fitted without it)."""
    rows = []
    for ref in GEMMS:
        half = _half_rate(ref)
        others = [r for r in fit_rows_of(half) if r is not ref]
        held_out = fit_tc_eff(others, params) if others else float("nan")
        loo_params = replace(params, tc_eff_half_rate=held_out) if half else replace(params, tc_eff=held_out)
        loo = predicted_gemm_tflops(ref, loo_params)
        pred = predicted_gemm_tflops(ref, params)
        rows.append({**ref.__dict__, "implied_tc_eff": implied_tc_eff(ref, params) if ref.dtype != "fp32" else None,
                     "predicted_tflops": pred, "error_pct": 100 * (pred / ref.tflops - 1),
                     "loo_tc_eff": held_out if ref.dtype != "fp32" else None,
                     "loo_error_pct": 100 * (loo / ref.tflops - 1) if ref.dtype != "fp32" else None})
    return rows


@dataclass(frozen=True)
class Reference:
    """One published measurement: images per second of a model on a GPU."""

    gpu: str
    model: str
    dtype: str
    mode: str  # "train" (forward + backward + step) or "infer" (forward)
    batch_size: int
    images_per_s: float
    layout: str
    source: str


REFERENCES: tuple[Reference, ...] = (
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 112, 367.0, "NCHW", f"{DLE}, DGX-1 16GB, 1 GPU; {DLE_CFG}"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 112, 356.0, "NCHW", f"{DLE}, DGX-1 32GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 1200.0, "NHWC", f"{DLE}, DGX-1 16GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 1156.0, "NHWC", f"{DLE}, DGX-1 32GB, 1 GPU"),
    Reference("a100-sxm4-80gb", "resnet50", "tf32", "train", 256, 938.0, "NCHW", f"{DLE}, DGX A100 80GB, 1 GPU"),
    Reference("a100-sxm4-80gb", "resnet50", "amp", "train", 256, 2470.0, "NHWC", f"{DLE}, DGX A100 80GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "infer", 256, 1261.0, "NCHW", f"{DLE}, inference, DGX-1 16GB"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "infer", 256, 3382.0, "NHWC", f"{DLE}, inference, DGX-1 16GB"),
    Reference("t4", "resnet50", "fp32", "infer", 256, 415.0, "NCHW", f"{DLE}, inference, T4"),
    Reference("t4", "resnet50", "amp", "infer", 256, 1198.0, "NHWC", f"{DLE}, inference, T4"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 128, 128 / 0.34237, "NCHW", f"{SKB}, 342.37 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 128, 128 / 0.15220, "NCHW", f"{SKB}, 152.20 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 128, 128 / 0.11093, "NHWC", f"{SKB}, 110.93 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 128, 128 / 0.41284, "NHWC", f"{SKB}, 412.84 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 893.09, "NCHW", f"{DLE1910}, DGX-1 16G, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 849.63, "NCHW", f"{DLE1910}, DGX-1 32G, 1 GPU"),
)


# Note [Lambda resnet50 rows]
# lambdal/deeplearning-benchmark runs NVIDIA DeepLearningExamples' ConvNets main.py (LambdaLabsML fork, branch
# lambda/benchmark) in a PyTorch NGC container (pytorch/README.md: 22.09-py3 tested) on 1 GPU: --arch resnet50
# --data-backend synthetic --training-only --prof 100 --epochs 2, fp16 = --amp --static-loss-scale 256 (torch.cuda.amp
# GradScaler), no --memory-format so NCHW (main.py's default), SGD with momentum. The published number is DLE's
# train img/s (scripts/compile_results_pytorch_throughput.py: "Summary: train.loss ..." line). The "fp32" column is
# TF32 on Ampere and later (cuDNN convolutions run TF32 unless torch.backends.cudnn.allow_tf32 is cleared, and the
# script does not clear it), plain fp32 on Volta/Turing. Batch sizes: pytorch-train-bs-fp32.csv / -fp16.csv; the A10
# and H100 SXM5 rows are not in those CSVs, so their batch is the memory template the README tells a config to source
# (config_pytorch_24GB.sh: 224 / 448; config_pytorch_80GB.sh: 640 / 1280). The Quadro RTX 8000 is not in gpemu's
# catalog and is priced as its same-chip sibling quadro-rtx-6000 (both TU102, 4608 cores, 1770 MHz boost, 672 GB/s;
# 48 vs 24 GB); the A100 80GB PCIe was added to the catalog for these rows (session 8, from the A100 datasheet).
# Lambda Cloud's V100 16GB is priced as v100-sxm2-32gb (as the DGX-1 16GB rows above).
LAMBDA_REPO = "lambdal/deeplearning-benchmark"
LAMBDA_TPUT = f"{LAMBDA_REPO} pytorch/pytorch-train-throughput-fp{{bits}}.csv @ 0551cb70ffdc155dc4cb2c10dddebb65651c3883"
LAMBDA_BS = f"{LAMBDA_REPO} pytorch/pytorch-train-bs-fp{{bits}}.csv @ 08d77c41c42f48de5598b48c77f3fbd1b6252348"
LAMBDA_TEMPLATE = {24: f"{LAMBDA_REPO} pytorch/scripts/config_v1/config_pytorch_24GB.sh @ 188936494f1fd432758a4a462b94d0a805999c85",
                   80: f"{LAMBDA_REPO} pytorch/scripts/config_v1/config_pytorch_80GB.sh @ 357c49a7cc7eaff2c74614f7dbc4a72800ba350f"}
# (row name, gpemu GPU, fp32 img/s, fp32 batch, fp16 img/s, fp16 batch, GB of the template the batch comes from or 0
# when the bs CSVs list it)
_LAMBDA_RESNET50: tuple[tuple[str, str, float, int, float, int, int], ...] = (
    ("Quadro RTX 8000", "quadro-rtx-6000", 274.0, 496, 651.0, 928, 0),
    ("LambdaCloud V100 16GB", "v100-sxm2-32gb", 369.0, 128, 833.0, 256, 0),
    ("RTX 3090", "rtx3090", 513.0, 224, 905.0, 448, 0),
    ("LambdaCloud A10", "a10", 349.0, 224, 638.0, 448, 24),
    ("LambdaCloud A100 40GB PCIe", "a100-pcie-40gb", 882.0, 360, 1396.0, 720, 0),
    ("A100 80GB PCIe", "a100-pcie-80gb", 1014.0, 640, 1527.0, 1280, 0),
    ("A100 80GB SXM4", "a100-sxm4-80gb", 1066.0, 640, 1582.0, 1280, 0),
    ("RTX 6000 Ada", "rtx6000-ada", 647.0, 496, 1146.0, 928, 0),  # the bs CSVs call it "Ada A6000"
    ("RTX A6000", "rtx-a6000", 514.0, 496, 916.0, 928, 0),
    ("RTX 4090", "rtx4090", 721.0, 224, 1301.0, 448, 0),
    ("H100 80GB PCIe Gen5", "h100-pcie-80gb", 1197.0, 640, 1866.0, 1280, 0),
    ("H100 80GB SXM5", "h100-sxm5-80gb", 1753.0, 640, 2616.0, 1280, 80),
)
_NO_TF32 = ("volta", "turing")


def _lambda_rows() -> tuple[Reference, ...]:
    rows = []
    for name, gpu, fp32_ips, fp32_bs, fp16_ips, fp16_bs, template in _LAMBDA_RESNET50:
        fp32_dtype = "fp32" if get_gpu(gpu).arch in _NO_TF32 else "tf32"  # Note [Lambda resnet50 rows]
        for dtype, bits, ips, bs in ((fp32_dtype, 32, fp32_ips, fp32_bs), ("amp", 16, fp16_ips, fp16_bs)):
            batch_src = LAMBDA_TEMPLATE[template] if template else LAMBDA_BS.format(bits=bits)
            rows.append(Reference(gpu, "resnet50", dtype, "train", bs, ips, "NCHW",
                                  f"{LAMBDA_TPUT.format(bits=bits)}, row '{name}', column resnet50 (1 GPU); "
                                  f"batch from {batch_src}"))
    return tuple(rows)


LAMBDA_REFERENCES: tuple[Reference, ...] = _lambda_rows()


@dataclass(frozen=True)
class SquadReference:
    """One published BERT SQuAD fine-tuning throughput: training sequences (of 384 tokens) per second."""

    gpu: str
    model: str  # "bert-base" or "bert-large" (bench/_bert_squad.py)
    dtype: str  # fp32, tf32 or fp16 (apex O2)
    batch_size: int
    sequences_per_s: float
    source: str


# Lambda's bert_base_squad / bert_large_squad columns, same rows and GPU mapping as _LAMBDA_RESNET50 (bench/
# _bert_squad.py says how run_squad.py runs): (row, gpu, template GB or 0, then per (base fp32, base fp16, large fp32,
# large fp16) the published sequences/s and batch)
_LAMBDA_BERT: tuple[tuple[str, str, int, tuple[tuple[float, int], ...]], ...] = (
    ("Quadro RTX 8000", "quadro-rtx-6000", 0, ((41.0, 96), (146.0, 192), (12.0, 32), (50.0, 64))),
    ("LambdaCloud V100 16GB", "v100-sxm2-32gb", 0, ((42.0, 24), (189.0, 48), (12.0, 8), (57.0, 16))),
    ("RTX 3090", "rtx3090", 0, ((85.0, 48), (172.0, 96), (24.0, 16), (52.0, 28))),
    ("LambdaCloud A10", "a10", 24, ((70.0, 48), (135.0, 96), (19.0, 16), (42.0, 28))),
    ("LambdaCloud A100 40GB PCIe", "a100-pcie-40gb", 0, ((179.0, 80), (368.0, 160), (53.0, 28), (117.0, 48))),
    ("A100 80GB PCIe", "a100-pcie-80gb", 0, ((224.0, 172), (415.0, 320), (70.0, 64), (140.0, 112))),
    ("A100 80GB SXM4", "a100-sxm4-80gb", 0, ((239.0, 172), (443.0, 320), (75.0, 64), (152.0, 112))),
    ("RTX 6000 Ada", "rtx6000-ada", 0, ((136.0, 96), (255.0, 192), (44.0, 32), (79.0, 64))),
    ("RTX A6000", "rtx-a6000", 0, ((101.0, 96), (198.0, 192), (33.0, 32), (68.0, 64))),
    ("RTX 4090", "rtx4090", 0, ((137.0, 48), (297.0, 96), (44.0, 16), (93.0, 28))),
    ("H100 80GB PCIe Gen5", "h100-pcie-80gb", 0, ((292.0, 172), (567.0, 320), (97.0, 64), (203.0, 112))),
    ("H100 80GB SXM5", "h100-sxm5-80gb", 80, ((408.0, 172), (812.0, 320), (141.0, 64), (301.0, 112))),
)


def _lambda_bert_rows() -> tuple[SquadReference, ...]:
    rows = []
    for name, gpu, template, figures in _LAMBDA_BERT:
        fp32_dtype = "fp32" if get_gpu(gpu).arch in _NO_TF32 else "tf32"  # bench/_bert_squad.py: TF32 GEMMs
        for (seqs, bs), model, dtype, bits in zip(figures, ("bert-base", "bert-base", "bert-large", "bert-large"),
                                                  (fp32_dtype, "fp16", fp32_dtype, "fp16"), (32, 16, 32, 16),
                                                  strict=True):
            batch_src = LAMBDA_TEMPLATE[template] if template else LAMBDA_BS.format(bits=bits)
            column = "bert_base_squad" if model == "bert-base" else "bert_large_squad"
            rows.append(SquadReference(gpu, model, dtype, bs, seqs,
                                       f"{LAMBDA_TPUT.format(bits=bits)}, row '{name}', column {column} (1 GPU); "
                                       f"batch from {batch_src}"))
    return tuple(rows)


LAMBDA_SQUAD: tuple[SquadReference, ...] = _lambda_bert_rows()


def squad_rows(params: CostParams) -> list[dict[str, object]]:
    """Return one dict per SQuAD reference with gpemu's sequences/s (bench/_bert_squad.py) and its error."""
    from _bert_squad import predicted_sequences_per_s  # bench/ is the script's directory

    rows = []
    for ref in LAMBDA_SQUAD:
        pred = predicted_sequences_per_s(ref.model, ref.gpu, ref.dtype, ref.batch_size, params)
        rows.append({**ref.__dict__, "arch": get_gpu(ref.gpu).arch, "predicted_sequences_per_s": pred,
                     "error_pct": 100 * (pred / ref.sequences_per_s - 1)})
    return rows


@dataclass(frozen=True)
class LayerReference:
    """One published transformer-layer throughput: best TFLOPS over a batch x sequence grid (fp16 layer)."""

    gpu: str
    layer: str  # a key of _transformer_layers.LAYERS
    mode: str  # "fwd" or "fwd+bwd"
    tflops: float
    seqs: tuple[int, ...]
    batches: tuple[int, ...]
    source: str


MLI_LAYER = ("mli/transformers-benchmarks README.md 'Micro-Benchmarking Summary' (micro_bench.ipynb: transformers "
             "BertLayer(bert-large) / GPT2Block(gpt2-medium), .half(), NGC pytorch:22.07; best over the grid)")
_BERT_GRID = ((128, 512), (2, 4, 8, 16, 32, 64, 128))
_GPT2_GRID = ((512, 1024), (2, 4, 8, 16, 32, 64))
LAYER_REFS: tuple[LayerReference, ...] = tuple(
    LayerReference(gpu, layer, mode, tflops, *grid, f"{MLI_LAYER}, {label}")
    for gpu, label, values in (("a100-sxm4-80gb", "A100 80GB", (110.0, 136.0, 45.0, 53.0)),
                               ("v100-sxm2-32gb", "V100 16GB", (56.0, 67.0, 34.0, 37.0)))
    for (layer, mode, grid), tflops in zip(
        (("bert-large layer", "fwd", _BERT_GRID), ("bert-large layer", "fwd+bwd", _BERT_GRID),
         ("gpt2-medium block", "fwd", _GPT2_GRID), ("gpt2-medium block", "fwd+bwd", _GPT2_GRID)), values,
        strict=True)
)


def layer_rows(params: CostParams) -> list[dict[str, object]]:
    """Return one dict per layer reference with gpemu's best TFLOPS over the same grid."""
    from _transformer_layers import best_tflops  # bench/ is the script's directory

    cache: dict[tuple[str, str], tuple[float, float, str, str]] = {}
    rows = []
    for ref in LAYER_REFS:
        key = (ref.layer, ref.gpu)
        if key not in cache:
            cache[key] = best_tflops(ref.layer, ref.gpu, ref.seqs, ref.batches, params)
        fwd, both, at_fwd, at_both = cache[key]
        pred, at = (fwd, at_fwd) if ref.mode == "fwd" else (both, at_both)
        rows.append({**ref.__dict__, "predicted_tflops": pred, "best_at": at,
                     "error_pct": 100 * (pred / ref.tflops - 1)})
    return rows


def predicted_images_per_s(ref: Reference) -> float:
    """Return gpemu's predicted images per second for one reference configuration."""
    fmt = "channels_last" if ref.layout == "NHWC" else "nchw"
    phase = "forward" if ref.mode == "train" else "inference"  # eval mode, no_grad (Note [Inference forward])
    seconds = predict_phase(ref.gpu, ref.model, phase, ref.batch_size, ref.dtype, memory_format=fmt).value
    if ref.mode == "train":
        seconds += predict_phase(ref.gpu, ref.model, "backward", ref.batch_size, ref.dtype, memory_format=fmt).value
    return ref.batch_size / seconds


def _summary(console: Console, rows: Sequence[dict[str, object]], key: str, groups: dict[str, object]) -> None:
    for label, pick in groups.items():
        errs = sorted(abs(float(r[key])) for r in rows if pick(r))  # type: ignore[operator, arg-type]
        if errs:
            console.print(f"  {label}: {len(errs)} rows, median |error| {errs[len(errs) // 2]:.1f}%, "
                          f"max {errs[-1]:.1f}%")


def _figures(errs: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(abs(e) for e in errs)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]  # nearest-rank 90th percentile
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median_abs_pct": round(median, 2), "p90_abs_pct": round(p90, 2), "rows": len(ordered)}


def model_rows(refs: Sequence[Reference]) -> list[dict[str, object]]:
    """Return one dict per whole-model reference with gpemu's img/s, its error and the GPU's generation."""
    rows = []
    for ref in refs:
        pred = predicted_images_per_s(ref)
        rows.append({**ref.__dict__, "arch": get_gpu(ref.gpu).arch, "predicted_images_per_s": pred,
                     "error_pct": 100 * (pred / ref.images_per_s - 1)})
    return rows


def _by_gpu(rows: Sequence[dict[str, object]]) -> dict[str, dict[str, Any]]:
    """Return per catalog GPU: row count, signed median % error (+ = gpemu too fast) and median |error|."""
    return published_by_gpu_entries((get_gpu(str(r["gpu"])).key, float(r["error_pct"]))  # type: ignore[arg-type]
                                    for r in rows)


def write_expected_error(rows: Sequence[dict[str, object]], layers: Sequence[dict[str, object]],
                         squad: Sequence[dict[str, object]]) -> None:
    """Merge the tensor-core rows' errors into expected_error.json (Note [Expected error])."""
    path = EXPECTED_ERROR_PATH
    table = json.loads(path.read_text()) if path.exists() else {"paths": {}}
    tensor_core = [float(r["error_pct"]) for r in rows if r["dtype"] != "fp32"]  # type: ignore[arg-type]
    table["paths"]["published-models"] = {
        "basis": "published real-GPU whole-model training and inference throughputs with tensor cores (TF32 / "
                 "AMP, NCHW and NHWC resnet50 on Volta to Hopper: NVIDIA DeepLearningExamples, Lambda's "
                 "deeplearning-benchmark; bench/published_validation.py)",
        "step": _figures(tensor_core)}
    tc_squad = [float(r["error_pct"]) for r in squad if r["dtype"] != "fp32"]  # type: ignore[arg-type]
    table["paths"]["published-layers"] = {
        "basis": "published real-GPU fp16 TFLOPS of BERT-large / GPT-2-medium layers, best over a batch x sequence "
                 "grid, and BERT-base/large SQuAD fine-tuning steps (TF32 / fp16, Volta to Hopper; Lambda's "
                 "deeplearning-benchmark) (bench/published_validation.py)",
        "step": _figures([*(float(r["error_pct"]) for r in layers), *tc_squad])}  # type: ignore[arg-type]
    table["published_by_gpu"] = {**table.get("published_by_gpu", {}), **{  # See Note [Published bias per GPU]
        kind: _by_gpu(kind_rows) for kind, kind_rows in (("vision", rows), ("lm", [*squad, *layers]))}}
    table["fitted_sha256"] = fitted_sha256()
    table["published_note"] = f"bench/published_validation.py --write, {time.strftime('%Y-%m-%d')}"
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}")


def main() -> None:
    """Print the comparison tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    parser.add_argument("--write", action="store_true", help="store the tensor-core errors in expected_error.json")
    args = parser.parse_args()
    params = load_params()
    gemms = gemm_rows(params)
    layers = layer_rows(params)
    rows = model_rows(REFERENCES)
    lambda_rows = model_rows(LAMBDA_REFERENCES)
    squad = squad_rows(params)
    if args.write:
        write_expected_error([*rows, *lambda_rows], layers, squad)
    if args.json:
        print(json.dumps({"gemm": gemms, "layers": layers, "models": rows, "lambda_resnet50": lambda_rows,
                          "lambda_bert_squad": squad}, indent=1))
        return
    console = Console(width=200)
    table = Table(title=f"GEMM TFLOPS: published vs gpemu (packaged tc_eff {params.tc_eff:.4f})")
    for col in ("GPU", "dtype", "m x n x k", "published", "implied tc_eff", "predicted", "error", "LOO tc_eff",
                "LOO error", "source"):
        table.add_column(col, overflow="fold")
    for g in gemms:
        opt = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        table.add_row(str(g["gpu"]), str(g["dtype"]), f"{g['m']}x{g['n']}x{g['k']}", f"{g['tflops']:.1f}",
                      opt(g["implied_tc_eff"], ".3f"), f"{g['predicted_tflops']:.1f}", f"{g['error_pct']:+.1f}%",
                      opt(g["loo_tc_eff"], ".3f"), opt(g["loo_error_pct"], "+.1f"), str(g["source"]))
    console.print(table)
    full, half = fit_rows_of(False), fit_rows_of(True)
    console.print(f"tc_eff fitted on all {len(full)} full-rate tensor-core rows: {fit_tc_eff(full, params):.4f}; "
                  f"tc_eff_half_rate on the {len(half)} half-rate rows (Note [Half-rate tensor cores]): "
                  f"{fit_tc_eff(half, params):.4f} (packaged {params.tc_eff_half_rate:.4f})")
    _summary(console, [g for g in gemms if g["loo_error_pct"] is not None], "loo_error_pct",
             {"tensor-core GEMMs, leave-one-out": lambda r: True})

    table = Table(title=f"Streaming bandwidth: published vs gpemu's m_stream (packaged {params.m_stream:.4f})")
    for col in ("GPU", "published GB/s", "efficiency", "LOO m_stream", "LOO error", "source"):
        table.add_column(col, overflow="fold")
    loo_errs = []
    for ref in STREAMS:
        held_out = fit_m_stream([r for r in STREAMS if r is not ref])
        loo_errs.append({"e": 100 * (held_out / ref.efficiency - 1)})
        table.add_row(ref.gpu, f"{ref.efficiency * ref.datasheet_gbps:.0f}", f"{ref.efficiency:.3f}",
                      f"{held_out:.3f}", f"{loo_errs[-1]['e']:+.1f}%", ref.source)
    console.print(table)
    console.print(f"m_stream fitted on all {len(STREAMS)} rows: {fit_m_stream(STREAMS):.4f}")
    _summary(console, loo_errs, "e", {"streaming bandwidth, leave-one-out": lambda r: True})

    table = Table(title="Transformer layers (fp16): published best TFLOPS vs gpemu's best over the same grid")
    for col in ("GPU", "layer", "mode", "published", "predicted", "gpemu's best at", "error", "source"):
        table.add_column(col, overflow="fold")
    for r in layers:
        table.add_row(str(r["gpu"]), str(r["layer"]), str(r["mode"]), f"{r['tflops']:.0f}",
                      f"{r['predicted_tflops']:.1f}", str(r["best_at"]), f"{r['error_pct']:+.1f}%", str(r["source"]))
    console.print(table)
    _summary(console, layers, "error_pct", {"transformer layers": lambda r: True})

    table = Table(title="Whole models: published real-GPU throughput vs gpemu (img/s)")
    for col in ("GPU", "dtype", "mode", "batch", "layout", "published", "predicted", "error", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["gpu"], r["dtype"], r["mode"], str(r["batch_size"]), r["layout"], f"{r['images_per_s']:.0f}",
                      f"{r['predicted_images_per_s']:.0f}", f"{r['error_pct']:+.1f}%", r["source"])
    console.print(table)
    _summary(console, rows, "error_pct", {
        f"{layout} {dt}": (lambda r, layout=layout, dt=dt: r["layout"] == layout and r["dtype"] == dt)
        for layout in ("NCHW", "NHWC") for dt in ("fp32", "tf32", "amp")})
    _summary(console, rows, "error_pct", {layout: (lambda r, layout=layout: r["layout"] == layout)
                                          for layout in ("NCHW", "NHWC")})

    table = Table(title="Whole models: Lambda deeplearning-benchmark resnet50 training, 1 GPU, NCHW, synthetic data "
                        "(img/s; Note [Lambda resnet50 rows])")
    for col in ("GPU", "arch", "dtype", "batch", "published", "predicted", "error", "source"):
        table.add_column(col, overflow="fold")
    for r in lambda_rows:
        table.add_row(str(r["gpu"]), str(r["arch"]), str(r["dtype"]), str(r["batch_size"]),
                      f"{r['images_per_s']:.0f}", f"{r['predicted_images_per_s']:.0f}", f"{r['error_pct']:+.1f}%",
                      str(r["source"]))
    console.print(table)
    _summary(console, lambda_rows, "error_pct", {"all": lambda r: True})
    _summary(console, lambda_rows, "error_pct", {dt: (lambda r, dt=dt: r["dtype"] == dt) for dt in ("fp32", "tf32", "amp")})
    _summary(console, lambda_rows, "error_pct", {
        f"{arch} {dt}": (lambda r, arch=arch, dt=dt: r["arch"] == arch and r["dtype"] == dt)
        for arch in ("volta", "turing", "ampere", "ada", "hopper") for dt in ("fp32", "tf32", "amp")})
    _summary(console, lambda_rows, "error_pct", {arch: (lambda r, arch=arch: r["arch"] == arch)
                                                 for arch in ("volta", "turing", "ampere", "ada", "hopper")})
    signed = {arch: [float(r["error_pct"]) for r in lambda_rows if r["arch"] == arch]  # type: ignore[arg-type]
              for arch in ("volta", "turing", "ampere", "ada", "hopper")}
    console.print("  signed errors (+ = gpemu too fast): " + "; ".join(
        f"{arch} {', '.join(f'{e:+.0f}%' for e in errs)}" for arch, errs in signed.items() if errs))

    table = Table(title="BERT SQuAD fine-tuning (seq 384): Lambda deeplearning-benchmark, 1 GPU (sequences/s; "
                        "bench/_bert_squad.py)")
    for col in ("GPU", "arch", "model", "dtype", "batch", "published", "predicted", "error"):
        table.add_column(col, overflow="fold")
    for r in squad:
        table.add_row(str(r["gpu"]), str(r["arch"]), str(r["model"]), str(r["dtype"]), str(r["batch_size"]),
                      f"{r['sequences_per_s']:.0f}", f"{r['predicted_sequences_per_s']:.1f}", f"{r['error_pct']:+.1f}%")
    console.print(table)
    console.print(f"  sources: {LAMBDA_TPUT.format(bits='32|16')} (columns bert_base_squad, bert_large_squad); "
                  f"batches: {LAMBDA_BS.format(bits='32|16')}, A10 / H100 SXM5 from the 24 / 80 GB templates")
    _summary(console, squad, "error_pct", {"all": lambda r: True})
    _summary(console, squad, "error_pct", {f"{m} {dt}": (lambda r, m=m, dt=dt: r["model"] == m and r["dtype"] == dt)
                                           for m in ("bert-base", "bert-large") for dt in ("fp32", "tf32", "fp16")})
    _summary(console, squad, "error_pct", {f"{arch} {dt}": (lambda r, arch=arch, dt=dt: r["arch"] == arch
                                                            and r["dtype"] == dt)
                                           for arch in ("volta", "turing", "ampere", "ada", "hopper")
                                           for dt in ("fp32", "tf32", "fp16")})
    signed = {arch: [float(r["error_pct"]) for r in squad if r["arch"] == arch]  # type: ignore[arg-type]
              for arch in ("volta", "turing", "ampere", "ada", "hopper")}
    console.print("  signed errors (+ = gpemu too fast): " + "; ".join(
        f"{arch} {', '.join(f'{e:+.0f}%' for e in errs)}" for arch, errs in signed.items() if errs))

    both = [*rows, *lambda_rows]
    _summary(console, both, "error_pct", {"all whole-model rows (both tables)": lambda r: True,
                                          "all tensor-core whole-model rows (what --write stores)":
                                          lambda r: r["dtype"] != "fp32"})


if __name__ == "__main__":
    main()
