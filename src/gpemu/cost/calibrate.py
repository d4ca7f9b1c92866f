"""Fit the time model's constants to measured phase times (run as `python -m gpemu.cost.calibrate`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gpemu.cost.model import (
    COMPUTE_PARAMS,
    DEFAULT_SHARED,
    MEMORY_PARAMS,
    PER_GPU_PARAMS,
    SHARED_PARAMS,
    CostParams,
    OpArrays,
    compress_views,
    host_seconds,
    kernel_seconds,
    load_params,
    spec_columns,
)
from gpemu.cost.predict import _phase_mask, _subset, batch_linear_ops
from gpemu.errors import GpemuError, closest
from gpemu.hardware import get_gpu

# Powers of two plus a few in between: enough to pin the curves, leaving most measured rows for validation.
FIT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
FITTED_JSON = Path(__file__).with_name("fitted.json")
PER_GPU_PRIOR = 0.05
MATMUL_EFFICIENCY_CAP = 0.9  # large SGEMM/HGEMM reach ~90% of peak (cuBLAS); the data cannot pin it (FC layers only)  # L2 weight on log per-GPU factors: they only absorb what the spec cannot explain


def load_measured_rows(path: str | Path) -> pd.DataFrame:
    """Return measured forward/backward rows (gpu key, workload, phase, batch_size, dtype, value) from a GPEmu
    ROWS.csv (kind,gpu,model,batch_size,value,unit,measured) or a native profile CSV; unknown GPUs are skipped."""
    df = pd.read_csv(path)
    if "kind" in df.columns:
        df = df.rename(columns={"kind": "phase", "model": "workload"})
        df["dtype"] = "fp32"
    df = df[(df["phase"].isin(["forward", "backward"])) & (df["measured"].astype(int) == 1)].copy()
    keys: dict[str, str | None] = {}
    for name in df["gpu"].unique():
        try:
            keys[name] = get_gpu(str(name)).key
        except GpemuError:
            keys[name] = None
    df["gpu"] = df["gpu"].map(keys)
    return df.dropna(subset=["gpu"]).reset_index(drop=True)


def _log_init() -> dict[str, torch.Tensor]:
    return {k: torch.tensor(math.log(DEFAULT_SHARED[k]), dtype=torch.float64, requires_grad=True)
            for k in SHARED_PARAMS}


def _concat(parts: Sequence[OpArrays]) -> OpArrays:
    cat = lambda attr: np.concatenate([getattr(o, attr) for o in parts])  # noqa: E731
    return OpArrays([n for o in parts for n in o.names], [c for o in parts for c in o.category],
                    [d for o in parts for d in o.dtype], cat("tensor_core"), cat("phase"), cat("flops"), cat("bytes"),
                    cat("flops_per_sample"), cat("bytes_per_sample"), cat("views_before"),
                    cat("plane"), pointwise=cat("pointwise"), group_width=cat("group_width"),
                    out_channels=cat("out_channels"), conv_batch=cat("conv_batch"), attn_scale=cat("attn_scale"),
                    row_len=cat("row_len"), channel_per_byte=cat("channel_per_byte"), gemm_align=cat("gemm_align"))


class _GpuBlock:
    """All (workload, phase) segments measured on one GPU, flattened into one op axis for a vectorised fit."""

    def __init__(self, gpu: str, rows: pd.DataFrame, batches: Sequence[int], m_stream: float = 0.0) -> None:
        self.gpu = gpu
        spec = get_gpu(gpu)
        parts, seg_ids, starts, ends = [], [], [], []
        if "dtype" not in rows.columns:
            rows = rows.assign(dtype="fp32")
        table = rows.pivot_table(index=["workload", "phase", "dtype"], columns="batch_size", values="value")
        table = table.reindex(columns=list(batches))
        offset = 0
        for seg, (workload, phase, dtype) in enumerate(table.index):
            all_ops = batch_linear_ops(str(workload), str(dtype))
            ops = compress_views(_subset(all_ops, _phase_mask(all_ops, str(phase))))
            parts.append(ops)
            seg_ids.append(np.full(len(ops.names), seg))
            starts.append(offset)
            offset += len(ops.names)
            ends.append(offset)
        self.ops = _concat(parts)
        # the shared fit's GPEmu rows are fp32 on CUDA cores (m_stream 0, as fitted); fit_gpu's rows may be 16-bit or
        # TF32 and are priced as predictions price them (m_stream, the GPU's tensor-core share)
        self.cols = spec_columns(self.ops, spec, load_params().tc_eff_for(spec), m_stream)
        b = np.asarray(batches, dtype=np.float64)[:, None]
        assert self.ops.flops_per_sample is not None and self.ops.bytes_per_sample is not None
        self.flops = torch.as_tensor(self.ops.flops[None, :] + self.ops.flops_per_sample[None, :] * b)
        self.nbytes = torch.as_tensor(self.ops.bytes[None, :] + self.ops.bytes_per_sample[None, :] * b)
        self.seg = torch.as_tensor(np.concatenate(seg_ids)).expand(len(batches), -1)
        self.starts = torch.as_tensor(starts)
        self.ends = torch.as_tensor(ends)
        values = table.to_numpy(dtype=np.float64).T  # [batches, segments]
        self.mask = torch.as_tensor(~np.isnan(values))
        self.log_measured = torch.as_tensor(np.log(np.where(np.isnan(values), 1.0, values)))
        self.n_seg = len(table.index)
        self.is_fwd = torch.as_tensor([ph == "forward" for _, ph, _ in table.index])

    def predict(self, p: dict[str, Any], f: dict[str, Any]) -> torch.Tensor:
        """Return predicted seconds [batches, segments] (each segment timed as one phase, see Note [Time model])."""
        kern = kernel_seconds(self.flops, self.nbytes, self.cols, p, f)
        host = host_seconds(self.ops, p, f)
        zero = torch.zeros(kern.shape[0], 1, dtype=kern.dtype)
        rev = torch.cat([torch.flip(torch.cumsum(torch.flip(kern, (-1,)), -1), (-1,)), zero], -1)
        tail = rev[:, :-1] - rev[:, self.ends][:, self.seg[0]]
        hc = torch.cat([torch.zeros(1, dtype=host.dtype), torch.cumsum(host, -1)])
        host_cum = hc[1:] - hc[self.starts][self.seg[0]]
        total = host_cum + tail
        out = torch.full((kern.shape[0], self.n_seg), -1e9, dtype=kern.dtype)
        out = out.scatter_reduce(-1, self.seg, total, reduce="amax", include_self=True)
        return out + torch.where(self.is_fwd, p["t0"], p["t0_bwd"])


def fit(rows: pd.DataFrame, batches: Sequence[int] = FIT_BATCHES, per_gpu: bool = True, steps: int = 200,
        progress: Any = None, free: Sequence[str] | None = None, start: CostParams | None = None) -> CostParams:
    """Return CostParams fitted by least squares on log(predicted/measured) over `rows` at `batches`; with `free`,
    only those shared constants (and the per-GPU factors) move, from `start`'s values (Note [Targeted refits])."""
    rows = rows[rows["batch_size"].isin(list(batches)) & (rows["dtype"] == "fp32")]
    if rows.empty:
        raise GpemuError("no measured fp32 forward/backward rows to fit")
    gpus = sorted(rows["gpu"].unique())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~20x faster than 2+ threads on these mid-sized arrays on a shared machine
    try:
        return _fit(rows, gpus, batches, per_gpu, steps, progress, free, start)
    finally:
        torch.set_num_threads(threads)


# Note [Targeted refits]: `python -m gpemu.cost.calibrate --free a,b,c` refits only the named shared constants (and the
# per-GPU factors), starting from the packaged fitted.json and keeping every other constant. The fp32 rows cannot pin
# every constant separately (e.g. a CUDA-core convolution's backward against the batch norm beside it): a full refit
# after a change that concerns one kind of op can move constants the change has nothing to do with, which the
# published tensor-core rows (bench/published_validation.py, no part of the fit) then show. Session 7's group-width
# change (Note [Group width] in model.py): a full refit raised the fp32 batch-norm backward efficiency m_norm_bwd
# 0.37 -> 0.54 and put the published A100 TF32 NCHW resnet50 row at +35 % (was +7.7 %); refitting only the
# grouped-convolution constants kept it.
def _fit(rows: pd.DataFrame, gpus: list[str], batches: Sequence[int], per_gpu: bool, steps: int,
         progress: Any, free: Sequence[str] | None = None, start: CostParams | None = None) -> CostParams:
    blocks = [_GpuBlock(g, rows[rows["gpu"] == g], batches) for g in gpus]
    logp = _log_init()
    logf = {g: {k: torch.zeros((), dtype=torch.float64, requires_grad=per_gpu) for k in PER_GPU_PARAMS} for g in gpus}
    if free is not None:  # See Note [Targeted refits]
        for name in free:
            if name not in SHARED_PARAMS:
                close = closest(name, SHARED_PARAMS)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise GpemuError(f"unknown shared constant {name!r}{hint} (the constants: {', '.join(SHARED_PARAMS)})")
        base = start or load_params()
        logp = {k: torch.tensor(math.log(base.shared.get(k, DEFAULT_SHARED[k])), dtype=torch.float64,
                                requires_grad=k in free) for k in SHARED_PARAMS}
        for g in gpus:
            for k, v in base.per_gpu.get(g, {}).items():
                logf[g][k] = torch.tensor(math.log(v), dtype=torch.float64, requires_grad=per_gpu)
    leaves = [v for v in logp.values() if v.requires_grad] + (
        [v for d in logf.values() for v in d.values()] if per_gpu else [])
    opt = torch.optim.Adam(leaves, lr=0.08)
    n_rows = int(sum(int(b.mask.sum()) for b in blocks))
    for step in range(steps):
        opt.zero_grad()
        p = {k: v.exp() for k, v in logp.items()}
        loss = torch.zeros((), dtype=torch.float64)
        for block in blocks:
            f = {k: v.exp() for k, v in logf[block.gpu].items()}
            err = (block.predict(p, f).log() - block.log_measured) * block.mask
            loss = loss + (err**2).sum()
        loss = loss / n_rows
        if per_gpu:
            loss = loss + PER_GPU_PRIOR * sum((v**2 for d in logf.values() for v in d.values()), torch.zeros(()))
        loss.backward()
        opt.step()
        with torch.no_grad():
            # memory efficiencies are fractions of peak bandwidth; conv/matmul "efficiency" is against direct-conv
            # FLOPs and may exceed 1 (cuDNN's Winograd/FFT kernels do fewer multiplies): capped at 3.
            for k in MEMORY_PARAMS:
                logp[k].clamp_(max=0.0)
            for k in COMPUTE_PARAMS:
                logp[k].clamp_(max=math.log(3.0))
            # a GEMM cannot beat the peak (no Winograd for matmul); CNNs barely constrain e_matmul, so cap it at
            # cuBLAS's typical large-problem efficiency rather than let it drift to the conv cap.
            logp["e_matmul"].clamp_(max=math.log(MATMUL_EFFICIENCY_CAP))
            # a 1x1 convolution is a GEMM too (Note [Pointwise convolutions] in model.py): at most the peak
            for k in ("e_conv_1x1", "e_conv_1x1_bwd"):
                logp[k].clamp_(max=0.0)
        if step in (int(steps * 0.6), int(steps * 0.85)):
            for group in opt.param_groups:
                group["lr"] *= 0.3
        if progress is not None:
            progress(step + 1, steps, float(loss.detach()))
    shared = {k: float(v.detach().exp()) for k, v in logp.items()}
    per = {g: {k: float(v.detach().exp()) for k, v in d.items()} for g, d in logf.items()} if per_gpu else {}
    # tc_eff is not in this data (fp32 on CUDA cores): keep the packaged value, fitted on published GEMM throughputs
    return CostParams(shared, per, load_params().tc_eff, note=f"fit on {n_rows} measured rows, GPUs {', '.join(gpus)}")


# Note [Fitting a newly measured GPU]
# `python -m gpemu.cost.calibrate --add-gpu PROFILE.csv` fits one GPU's own factors -- a (CUDA-core compute), b
# (memory), c (host) and t (tensor-core convolutions: Note [Tensor-core convolution factor] in model.py) -- on the
# measured forward/backward rows a `gpemu profile` run wrote for it, every dtype, with the shared constants frozen at
# the packaged fit: the new GPU cannot move what the others were fitted to. The factors would serve that GPU's
# predictions of models and batch sizes its profile lacks (the spec path); they are never lent to other GPUs
# (CostParams.not_lent: fitted.json lists such GPUs under per_gpu_notes, with where their factors came from).
# Session 12 tried it on the H200 (bench/data/h200-2026-11-27; a 0.90-0.95, b 0.84, c 0.83, t 0.96) and does not ship
# the result. Fitted on half its models, the other half's spec-path rows went from 22.3 % to 18.1 % median |error|,
# mostly at small, host-bound batch sizes (c); but the unmodified imagenet script at batch 128 (fp32), emulated
# without the H200's profile, went from +13.1 % to +37.0 % against the card: b < 1 slows the memory-bound kernels,
# which the card's micro-benchmarks show are already priced slow (a 1 GiB fp32 add: 0.5x the measured speed). Lent to
# its nearest GPUs, the same factors took Lambda's H100 TF32 resnet50 row from +4.8 % to -22 % and the Ada / GA10x
# rows that borrowed them from 16 to 38 % median |error|. Four phase-level factors on one card absorb that card's
# host and its own mix of kernels rather than anything physical; the command stays for a user who wants their own
# card's spec path fitted, with that caveat.
def fit_gpu(rows: pd.DataFrame, gpu: str, batches: Sequence[int] = FIT_BATCHES, steps: int = 150,
            progress: Any = None) -> dict[str, float]:
    """Return `gpu`'s factors (a, b, c, t) fitted on its measured rows (any dtype), shared constants frozen."""
    key = get_gpu(gpu).key
    rows = rows[(rows["gpu"] == key) & rows["batch_size"].isin(list(batches))]
    if rows.empty:
        raise GpemuError(f"no measured forward/backward rows of {key} at batch sizes {list(batches)}")
    base = load_params()
    p = {k: torch.tensor(base.shared[k], dtype=torch.float64) for k in SHARED_PARAMS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        block = _GpuBlock(key, rows, batches, base.m_stream)
        logf = {k: torch.zeros((), dtype=torch.float64, requires_grad=True) for k in PER_GPU_PARAMS}
        opt = torch.optim.Adam(list(logf.values()), lr=0.05)
        n_rows = int(block.mask.sum())
        for step in range(steps):
            opt.zero_grad()
            err = (block.predict(p, {k: v.exp() for k, v in logf.items()}).log() - block.log_measured) * block.mask
            loss = (err**2).sum() / n_rows + PER_GPU_PRIOR * sum((v**2 for v in logf.values()), torch.zeros(()))
            loss.backward()
            opt.step()
            if step in (int(steps * 0.6), int(steps * 0.85)):
                for group in opt.param_groups:
                    group["lr"] *= 0.3
            if progress is not None:
                progress(step + 1, steps, float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return {k: float(v.detach().exp()) for k, v in logf.items()}


def main(argv: list[str] | None = None) -> None:
    """Refit from ROWS.csv and write src/gpemu/cost/fitted.json (the packaged constants)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[4] / "shared/data/gpemu-profiles/ROWS.csv"))
    parser.add_argument("--out", default=str(FITTED_JSON))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--add-gpu", default=None, metavar="PROFILE_CSV",
                        help="fit only this measured GPU's factors a, b, c, t into fitted.json (Note [Fitting a newly "
                             "measured GPU]); the shared constants and the other GPUs stay")
    parser.add_argument("--free", default="", help="comma-separated shared constants to refit, the rest kept from "
                                                   "the packaged fit (Note [Targeted refits])")
    args = parser.parse_args(argv)
    if args.add_gpu:
        _add_gpu(Path(args.add_gpu), Path(args.out), args.steps)
        return
    free = [k.strip() for k in args.free.split(",") if k.strip()] or None
    rows = load_measured_rows(args.data)
    from rich.progress import Progress

    with Progress() as bar:
        task = bar.add_task("fitting", total=args.steps)
        params = fit(rows, steps=args.steps, free=free,
                     progress=lambda i, n, loss: bar.update(task, completed=i, description=f"fit loss {loss:.4f}"))
    out = params.to_json()
    # tc_eff and m_stream (with their notes) are fitted on published figures, not on these rows: carry them over
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    out.update({k: v for k, v in old.items() if k in ("tc_eff", "m_stream", "tc_eff_half_rate") or k.endswith("_note")})
    for gpu in old.get("per_gpu_notes", {}):  # GPUs added with --add-gpu: not in these rows, kept as they were
        out["per_gpu"].setdefault(gpu, old["per_gpu"][gpu])
    if "per_gpu_notes" in old:
        out["per_gpu_notes"] = old["per_gpu_notes"]
    how = f"`python -m gpemu.cost.calibrate --free {','.join(free)}`" if free else "`python -m gpemu.cost.calibrate`"
    out["note"] = (f"{params.note}; data: GPEmu gpemu-profiles/ROWS.csv measured=1, batch sizes {list(FIT_BATCHES)}; "
                   f"fitted {dt.date.today().isoformat()} with {how}; torch {torch.__version__}")
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def _add_gpu(profile: Path, out: Path, steps: int) -> None:
    """Fit one GPU's factors from a native profile CSV and store them, with their provenance, in `out`."""
    from rich.progress import Progress

    rows = load_measured_rows(profile)
    if rows.empty:
        raise GpemuError(f"{profile}: no measured forward/backward rows of a catalog GPU")
    gpus = sorted(rows["gpu"].unique())
    doc = json.loads(out.read_text())
    for gpu in gpus:
        with Progress() as bar:
            task = bar.add_task(f"fitting {gpu}", total=steps)
            factors = fit_gpu(rows, gpu, steps=steps, progress=lambda i, n, loss, task=task, gpu=gpu: bar.update(
                task, completed=i, description=f"{gpu}: fit loss {loss:.4f}"))  # fmt: skip
        sub = rows[(rows["gpu"] == gpu) & rows["batch_size"].isin(list(FIT_BATCHES))]
        doc["per_gpu"][gpu] = factors
        doc.setdefault("per_gpu_notes", {})[gpu] = (
            f"factors a, b, c, t fitted on {len(sub)} measured rows ({', '.join(sorted(sub['dtype'].unique()))}; "
            f"{sub['workload'].nunique()} models) of {profile.name}, shared constants frozen (Note [Fitting a newly "
            f"measured GPU] in calibrate.py); {dt.date.today().isoformat()}; torch {torch.__version__}")
        print(gpu, json.dumps(factors))
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
