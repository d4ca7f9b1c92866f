"""Per-op check of gpemu.cost against a real GPU's kernel times: the measured ops file of `gpemu profile` against the
same profile taken under emulation, with the phase calibration off (GPEMU_PHASE_PREDICT=0: the raw cost model).

Usage: .venv/bin/python bench/op_validation.py [--measured-ops FILE.csv[.gz]] [--batch-size 64] [--models a,b]
                                              [--emulated DIR] [--fresh]

The measured file (default: the H200's, bench/data/h200-2026-11-27/ops-h200-sxm-141gb.csv.gz) holds torch.profiler's
kernel time per (aten op, input shapes) and training step. Kernel time is host-independent, so this isolates the
GPU model from the host-bound small-batch regime that the phase check (bench/heldout_gpu_validation.py) mixes in.
The emulated side runs `gpemu run --gpu <that GPU> -- python -m gpemu profile ... --ops` once (cached in --emulated;
--fresh re-runs it; ~5 s per model and dtype). Prints, per model and dtype, the summed kernel time per step
(measured, predicted, ratio), then per aten op over every model the measured and predicted sums and their ratio
(ops matched on name and input shapes). Ratios above 1: gpemu predicts slower than the GPU ran. Errors, not verdicts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OPS = REPO / "bench" / "data" / "h200-2026-11-27" / "ops-h200-sxm-141gb.csv.gz"
console = Console(width=150)
KEY = ["workload", "dtype", "op", "first_shape"]
# cuDNN's entry points on the card, torch's generic ops under emulation (the emulated device has no cuDNN)
CANONICAL_OPS = {"aten::cudnn_convolution": "aten::convolution", "aten::cudnn_batch_norm": "aten::native_batch_norm",
                 "aten::cudnn_batch_norm_backward": "aten::native_batch_norm_backward",
                 "aten::cudnn_convolution_transpose": "aten::convolution"}  # fmt: skip


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Return `df` with cuDNN op names mapped to torch's and the first input's shape as the shape key (the two sides
    record different trailing arguments)."""
    return df.assign(op=df["op"].replace(CANONICAL_OPS), first_shape=df["input_shapes"].str.extract(r"^\[(\[[^\]]*\])")[0])


def per_step_us(df: pd.DataFrame) -> pd.Series:
    """Return each row's kernel microseconds per training step (self time x calls)."""
    return df["self_device_time_us"] * df["calls_per_step"]


def run_emulated(gpu: str, models: list[str], batch: int, out: Path) -> None:
    """Profile `models` at `batch` under emulation of `gpu` (raw cost model) into `out`."""
    env = {**os.environ, "GPEMU_PHASE_PREDICT": "0", "GPEMU_REPLAY": "0", "GPEMU_BUILTIN_PROFILES": "0",
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "gpemu", "run", "--gpu", gpu, "--", sys.executable, "-m", "gpemu", "profile",
           "--models", ",".join(models), "--batch-sizes", str(batch), "--dtype", "fp32,amp", "--out", str(out),
           "--warmup", "1", "--reps", "2", "--op-batch-sizes", str(batch), "--no-transfers"]  # fmt: skip
    console.print(f"emulating: {' '.join(cmd[3:6])} ... ({len(models)} models)")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    """Compare measured and emulated per-op kernel times; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured-ops", type=Path, default=DEFAULT_OPS)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--models", default=None, help="comma-separated (default: every model measured at the batch)")
    parser.add_argument("--emulated", type=Path, default=None, help="directory of the emulated profile (cache)")
    parser.add_argument("--fresh", action="store_true", help="re-run the emulated profile")
    parser.add_argument("--top", type=int, default=18, help="ops to list")
    args = parser.parse_args()
    real = pd.read_csv(args.measured_ops)
    real = real[(real["batch_size"] == args.batch_size) & (real["measured"] == 1)]
    gpu = str(real["gpu"].iloc[0])
    models = args.models.split(",") if args.models else sorted(real["workload"].unique())
    real = real[real["workload"].isin(models)]
    out = args.emulated or REPO / "out" / f"op-validation-{gpu}-b{args.batch_size}"
    ops_file = out / "details" / f"ops-{gpu}.csv"
    if args.fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    run_emulated(gpu, models, args.batch_size, out)  # resumes: configurations already in `out` are skipped
    emu = pd.read_csv(ops_file)
    emu = emu[(emu["batch_size"] == args.batch_size) & emu["workload"].isin(models)]
    real = canonical(real.assign(us=per_step_us(real)))
    emu = canonical(emu.assign(us=per_step_us(emu)))

    t = Table(title=f"{gpu}, batch {args.batch_size}: kernel time per training step (sum of self device time)")
    for col in ("model", "dtype", "measured ms", "gpemu ms", "ratio"):
        t.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    ratios = []
    for (model, dtype), group in real.groupby(["workload", "dtype"]):
        e = emu[(emu["workload"] == model) & (emu["dtype"] == dtype)]
        if e.empty:
            continue
        m_ms, e_ms = group["us"].sum() / 1e3, e["us"].sum() / 1e3
        ratios.append((dtype, e_ms / m_ms))
        t.add_row(model, dtype, f"{m_ms:.2f}", f"{e_ms:.2f}", f"{e_ms / m_ms:.2f}")
    console.print(t)
    for dtype in ("fp32", "amp"):
        r = np.array([x for d, x in ratios if d == dtype])
        if len(r):
            err = 100 * np.abs(r - 1)
            console.print(f"{dtype}: {len(r)} models, kernel-time ratio median {np.median(r):.2f}, |error| median "
                          f"{np.median(err):.1f} %, p90 {np.percentile(err, 90):.1f} %")  # fmt: skip

    both = real.groupby(KEY)["us"].sum().to_frame("measured").join(emu.groupby(KEY)["us"].sum().rename("gpemu"), how="inner")
    matched = both["measured"].sum() / real["us"].sum()
    by_op = both.groupby(level=["dtype", "op"]).sum()
    by_op["share"] = by_op["measured"] / by_op.groupby(level="dtype")["measured"].transform("sum")
    by_op["ratio"] = by_op["gpemu"] / by_op["measured"]
    t = Table(title=f"per aten op, every model (matched on name and first input shape: {100 * matched:.0f} % of measured kernel time)")
    for col in ("dtype", "op", "share of time", "measured ms", "gpemu ms", "ratio"):
        t.add_column(col, justify="left" if col in ("dtype", "op") else "right")
    for dtype in ("fp32", "amp"):
        if dtype not in by_op.index.get_level_values("dtype"):
            continue
        top = by_op.loc[dtype].sort_values("measured", ascending=False).head(args.top)
        for op, r in top.iterrows():
            t.add_row(dtype, str(op), f"{100 * r['share']:.1f} %", f"{r['measured'] / 1e3:.2f}", f"{r['gpemu'] / 1e3:.2f}",
                      f"{r['ratio']:.2f}")  # fmt: skip
    console.print(t)


if __name__ == "__main__":
    main()
