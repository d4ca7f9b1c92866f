"""Run bench/gpu_micro.py on an emulated GPU and compare it with the same micro-benchmarks measured on the real card.

Usage: .venv/bin/python bench/gpu_micro_check.py [--measured bench/data/h200-2026-11-27/micro.csv] [--gpu h200]
                                                [--emulated out/micro-emulated.csv] [--reuse]

Prints, per group (matmul, SDPA backend and pass, convolution dtype / layout / pass, batch norm, copies, launches),
the median ratio emulated / measured time and the median and p90 of |log ratio| (as %), then the five rows furthest
off. A ratio below 1: gpemu is faster than the card. Errors, not verdicts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
KEY = ["kind", "name", "dtype", "layout", "shape", "pass"]
console = Console(width=150)


def compare(measured: pd.DataFrame, emulated: pd.DataFrame) -> pd.DataFrame:
    """Return the rows both files hold with their ratio emulated / measured."""
    for df in (measured, emulated):
        df[KEY] = df[KEY].fillna("")
    both = measured.merge(emulated, on=KEY, suffixes=("_real", "_emu"))
    both["ratio"] = both["time_s_emu"] / both["time_s_real"]
    both["group"] = [f"{k} {n if k == 'sdpa' else (d + ' ' + lay if k in ('conv', 'bn') else d)} {ps}".strip()
                     for k, n, d, lay, ps in zip(both["kind"], both["name"], both["dtype"], both["layout"],
                                                 both["pass"], strict=True)]  # fmt: skip
    return both


def main() -> None:
    """Emulate the micro-benchmarks (unless --reuse) and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=REPO / "bench" / "data" / "h200-2026-11-27" / "micro.csv")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--emulated", type=Path, default=REPO / "out" / "micro-emulated.csv")
    parser.add_argument("--reuse", action="store_true", help="compare an existing --emulated file")
    args = parser.parse_args()
    if not args.reuse:
        args.emulated.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "gpemu", "run", "--gpu", args.gpu, "--", sys.executable,
                        str(REPO / "bench" / "gpu_micro.py"), "--out", str(args.emulated), "--budget-s", "600"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    both = compare(pd.read_csv(args.measured), pd.read_csv(args.emulated))
    t = Table(title=f"{args.gpu} emulated / {args.measured} measured")
    for col in ("group", "n", "median ratio", "median |log ratio| %", "p90 |log ratio| %"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for group, g in both.groupby("group", sort=True):
        lr = np.abs(np.log(g["ratio"].to_numpy()))
        t.add_row(group, str(len(g)), f"{g['ratio'].median():.2f}", f"{100 * np.median(lr):.0f}",
                  f"{100 * np.percentile(lr, 90):.0f}")  # fmt: skip
    console.print(t)
    worst = both.reindex(np.abs(np.log(both["ratio"])).sort_values(ascending=False).index).head(5)
    for _, r in worst.iterrows():
        console.print(f"furthest: {' '.join(str(r[k]) for k in KEY if r[k])}: ratio {r['ratio']:.2f}")


if __name__ == "__main__":
    main()
