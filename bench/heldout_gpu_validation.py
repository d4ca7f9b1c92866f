"""Predict a GPU that no fit has seen and compare with its measured profile: the held-out-GPU check of gpemu.cost.

Usage: .venv/bin/python bench/heldout_gpu_validation.py [--measured CSV] [--no-shared] [--json OUT]

--measured is a native profile CSV written by `gpemu profile` on a real GPU (default: the H200 profile measured on
2026-11-27, src/gpemu/profiles/builtin/h200-sxm-141gb.csv; bench/data/h200-2026-11-27/README.md). Every measured
forward and backward row is predicted the way `gpemu predict` would on a machine without that GPU's profile: the
database is the built-in profiles minus that GPU's, plus GPEmu's rows in ../shared/data when present (--no-shared
leaves them out, as on a fresh install), so each figure comes from the nearest measured GPU scaled op by op or from
the spec model. The fitted constants never saw this GPU (its own factors, when fitted.json holds them, are left
out: it borrows as an unmeasured GPU would). Prints median / p90 absolute % error and the signed median
per phase, dtype, batch-size band and path, then the worst cases per phase. Errors, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import track
from rich.table import Table

from gpemu.cost.model import CostParams, load_params
from gpemu.cost.predict import predict_phase
from gpemu.hardware import get_gpu
from gpemu.profiles.db import ProfileDB, builtin_profile_paths
from gpemu.profiles.native import read_profile_csv

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MEASURED = REPO / "src" / "gpemu" / "profiles" / "builtin" / "h200-sxm-141gb.csv"
SHARED_ROWS = Path(os.environ.get("GPEMU_SHARED_DATA", REPO.parent / "shared" / "data")) / "gpemu-profiles" / "ROWS.csv"
BANDS = ((1, 1, "1"), (2, 16, "2-16"), (17, 64, "17-64"), (65, 100_000, ">=65"))
console = Console(width=150)


def shared_rows(path: Path) -> pd.DataFrame:
    """Return GPEmu's ROWS.csv (fp32 forward/backward of 30 CNNs on 5 GPUs) as native profile rows."""
    df = pd.read_csv(path)
    df = df[df["kind"].isin(["forward", "backward"])].rename(columns={"kind": "phase", "model": "workload"})
    df["dtype"] = "fp32"
    df["source"] = "GPEmu profiles (../shared/data)"
    return df[["gpu", "workload", "phase", "batch_size", "dtype", "value", "unit", "measured", "source"]]


def heldout_db(gpu_key: str, use_shared: bool) -> ProfileDB:
    """Return the built-in profiles without `gpu_key`'s rows, plus ../shared/data's GPEmu rows when asked."""
    tables = [read_profile_csv(p) for p in builtin_profile_paths()]
    rows = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(rows):
        keys = {g: get_gpu(str(g)).key for g in rows["gpu"].unique()}
        rows = rows[rows["gpu"].map(keys) != gpu_key]
    if use_shared and SHARED_ROWS.exists():
        rows = pd.concat([shared_rows(SHARED_ROWS), rows], ignore_index=True)
    return ProfileDB.from_rows(rows)


def heldout_params(gpu_key: str) -> CostParams:
    """Return the packaged constants without `gpu_key`'s own fitted factors (it then borrows, as if never fitted)."""
    params = load_params()
    return replace(params, per_gpu={k: v for k, v in params.per_gpu.items() if k != gpu_key},
                   not_lent=params.not_lent - {gpu_key})  # fmt: skip


def predictions(measured: pd.DataFrame, gpu_key: str, db: ProfileDB) -> pd.DataFrame:
    """Return one row per measured forward/backward figure with the held-out prediction and its path."""
    spec = get_gpu(gpu_key)
    params = heldout_params(gpu_key)
    out = []
    rows = measured[measured["phase"].isin(["forward", "backward"]) & (measured["measured"].astype(int) == 1)]
    for r in track(list(rows.itertuples()), description="predicting", console=console):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = predict_phase(spec, r.workload, r.phase, int(r.batch_size), dtype=r.dtype, db=db, params=params)
        if not est.ok:
            continue
        path = est.path or est.kind
        out.append({"workload": r.workload, "phase": r.phase, "batch_size": int(r.batch_size), "dtype": r.dtype,
                    "measured_s": float(r.value), "pred_s": est.value, "path": path.split(":")[0],
                    "source_gpu": path.split(":")[1] if ":" in path else ""})  # fmt: skip
    df = pd.DataFrame(out)
    both = df.pivot_table(index=["workload", "batch_size", "dtype"], columns="phase", values=["measured_s", "pred_s"])
    both = both.dropna()
    step = pd.DataFrame({"workload": [i[0] for i in both.index], "batch_size": [i[1] for i in both.index],
                         "dtype": [i[2] for i in both.index], "phase": "step",
                         "measured_s": both[("measured_s", "forward")].values + both[("measured_s", "backward")].values,
                         "pred_s": both[("pred_s", "forward")].values + both[("pred_s", "backward")].values})  # fmt: skip
    paths = df[df["phase"] == "forward"].set_index(["workload", "batch_size", "dtype"])["path"]
    step["path"] = [paths.get(k, "") for k in zip(step["workload"], step["batch_size"], step["dtype"], strict=True)]
    df = pd.concat([df, step], ignore_index=True)
    df["err_pct"] = 100.0 * (df["pred_s"] - df["measured_s"]) / df["measured_s"]
    return df


def _figures(err: np.ndarray) -> tuple[str, str, str, str]:
    if len(err) == 0:
        return "0", "-", "-", "-"
    a = np.abs(err)
    return str(len(err)), f"{np.median(a):.1f}", f"{np.percentile(a, 90):.1f}", f"{np.median(err):+.1f}"


def table(df: pd.DataFrame, by: str, title: str) -> Table:
    """Return a table of n / median / p90 / signed median error per phase and value of `by`."""
    t = Table(title=title)
    for col in (by, "phase", "n", "median |err| %", "p90 |err| %", "signed median %"):
        t.add_column(col, justify="right" if col not in (by, "phase") else "left")
    for key, group in df.groupby(by, sort=True):
        for phase in ("forward", "backward", "step"):
            err = group[group["phase"] == phase]["err_pct"].to_numpy()
            if len(err):
                t.add_row(str(key), phase, *_figures(err))
    return t


def main() -> None:
    """Predict the held-out GPU's measured rows and print the error tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=DEFAULT_MEASURED)
    parser.add_argument("--no-shared", action="store_true", help="leave ../shared/data's GPEmu rows out of the db")
    parser.add_argument("--json", type=Path, default=None, help="write the per-row predictions here")
    args = parser.parse_args()
    measured = read_profile_csv(args.measured)
    gpu_key = get_gpu(str(measured["gpu"].iloc[0])).key
    db = heldout_db(gpu_key, use_shared=not args.no_shared)
    console.print(f"held-out GPU {gpu_key}: {args.measured}; database {len(db.rows)} rows on {', '.join(db.gpus()) or 'none'}")
    df = predictions(measured, gpu_key, db)
    df["band"] = pd.cut(df["batch_size"], [b[0] - 0.5 for b in BANDS] + [BANDS[-1][1]], labels=[b[2] for b in BANDS])
    df["all"] = "all"
    console.print(table(df, "all", f"{gpu_key} held out: every measured row"))
    console.print(table(df, "dtype", "by dtype"))
    console.print(table(df, "band", "by batch size"))
    console.print(table(df, "path", "by prediction path"))
    for phase in ("forward", "backward", "step"):
        worst = df[df["phase"] == phase].reindex(df[df["phase"] == phase]["err_pct"].abs().sort_values(ascending=False).index)
        console.print(f"[bold]worst {phase}[/]: " + "; ".join(
            f"{r.workload} b{r.batch_size} {r.dtype} {r.err_pct:+.0f}% ({r.path})" for r in worst.head(8).itertuples()))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(df.drop(columns=["band"]).to_dict(orient="records"), indent=1))
        console.print(f"rows -> {args.json}")


if __name__ == "__main__":
    main()
