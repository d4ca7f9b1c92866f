"""Compare gpemu's predicted training memory with a real GPU's measured rows (mem_peak, mem_persistent).

Usage: .venv/bin/python bench/heldout_memory_validation.py [--measured PROFILE.csv] [--json OUT]

--measured is a native profile CSV written by `gpemu profile` (default: the H200's of 2026-11-27,
src/gpemu/profiles/builtin/h200-sxm-141gb.csv: torch 2.11, SGD-momentum training steps, fp32 and AMP). Each row is
predicted by `gpemu.memory.predict_memory` for the installed torch's semantics (set_to_none zero_grad, cuBLAS
workspaces); memory does not depend on measured timings, so nothing is held out but the rows themselves. Prints
median / p90 absolute % error and the signed median per dtype for the peak and the persistent memory, then the rows
furthest off. The profiler measures each configuration in one long process, so a model without GEMMs carries the
cuBLAS workspaces an earlier model allocated (64 MiB on Hopper): small models at batch 1 read low for that reason.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import track
from rich.table import Table

from gpemu.memory.predict import predict_memory
from gpemu.profiles.native import read_profile_csv

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MEASURED = REPO / "src" / "gpemu" / "profiles" / "builtin" / "h200-sxm-141gb.csv"
console = Console(width=150)


def main() -> None:
    """Predict every measured memory row and print the error tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=DEFAULT_MEASURED)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = read_profile_csv(args.measured)
    gpu = str(rows["gpu"].iloc[0])
    rows = rows[rows["phase"].isin(["mem_peak", "mem_persistent"]) & (rows["measured"].astype(int) == 1)]
    table = rows.pivot_table(index=["workload", "batch_size", "dtype"], columns="phase", values="value").reset_index()
    out = []
    for r in track(list(table.itertuples()), description="simulating", console=console):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mem = predict_memory(gpu, str(r.workload), int(r.batch_size), str(r.dtype))
        out.append({"workload": r.workload, "batch_size": int(r.batch_size), "dtype": r.dtype,
                    "peak_mib": float(r.mem_peak), "pred_peak_mib": float(mem["peak_mib"]),  # type: ignore[arg-type]
                    "persistent_mib": float(r.mem_persistent),
                    "pred_persistent_mib": float(mem["persistent_mib"])})  # type: ignore[arg-type]  # fmt: skip
    df = pd.DataFrame(out)
    df["err_peak"] = 100 * (df["pred_peak_mib"] / df["peak_mib"] - 1)
    df["err_persistent"] = 100 * (df["pred_persistent_mib"] / df["persistent_mib"] - 1)
    t = Table(title=f"{gpu}: predicted / measured training memory")
    for col in ("dtype", "rows", "peak median |err| %", "peak p90 %", "peak signed %", "persistent median |err| %",
                "persistent p90 %"):
        t.add_column(col, justify="left" if col == "dtype" else "right")
    for dtype, g in df.groupby("dtype"):
        pk, ps = g["err_peak"].to_numpy(), g["err_persistent"].to_numpy()
        t.add_row(str(dtype), str(len(g)), f"{np.median(np.abs(pk)):.1f}", f"{np.percentile(np.abs(pk), 90):.1f}",
                  f"{np.median(pk):+.1f}", f"{np.median(np.abs(ps)):.1f}", f"{np.percentile(np.abs(ps), 90):.1f}")  # fmt: skip
    console.print(t)
    worst = df.reindex(df["err_peak"].abs().sort_values(ascending=False).index).head(8)
    console.print("furthest peaks: " + "; ".join(
        f"{r.workload} b{r.batch_size} {r.dtype} {r.err_peak:+.0f}% ({r.peak_mib:.0f} MiB)" for r in worst.itertuples()))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
