"""Validate gpemu.cost predictions on GPEmu's measured rows: leave-one-GPU-out and leave-models-out.

Usage: .venv/bin/python bench/predict_validation.py [--steps 150] [--folds 5] [--no-cache]

Leave-one-GPU-out: for each of the 5 GPUs, refit on the other 4, then predict every measured forward/backward row
of the held-out GPU (all batch sizes) (a) from its spec with the nearest fitted GPU's factors ("spec-model") and (b) by scaling each other GPU's
measured row by model(Y)/model(X) ("scaled-from:X"; "nearest" = what predict_phase does: the nearest GPU that measured the
model (Note [Choosing the source GPU]) where it has the batch size, else the spec model (Note [Nearest source or the
spec model])).
Leave-models-out: models split into --folds folds; for each fold refit on all GPUs without those models and
predict them from the spec model with the fitted per-GPU factors. Fold fits are cached under the gpemu cache dir.
Prints median and p90 absolute % error for forward, backward and their sum (measured rows only); errors, not verdicts.
Profile lookups: on the grid the fits use (batch 1, 2, 4, ..., 256: gaps like those of a user's own profile; the data
has many more batch sizes, whose neighbours would make interpolation look better than it is), each measured row
left out in turn and looked up from the rest of its series by ProfileDB (interpolated between its neighbours, or
extrapolated when it was the smallest or largest batch size).
--write stores the errors of each path in src/gpemu/cost/expected_error.json, which `gpemu predict` shows beside
each figure (Note [Expected error] in gpemu/cost/expected_error.py); run it after every refit of fitted.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gpemu.cost.calibrate import FIT_BATCHES, fit, load_measured_rows
from gpemu.cost.expected_error import EXPECTED_ERROR_PATH, fitted_sha256
from gpemu.cost.model import CostParams
from gpemu.cost.predict import borrow_factors, model_phase_seconds
from gpemu.cost.similarity import source_distance
from gpemu.hardware import get_gpu
from gpemu.paths import cache_dir
from gpemu.profiles.db import ProfileDB

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GPEMU_SHARED_DATA", REPO.parent / "shared" / "data")) / "gpemu-profiles" / "ROWS.csv"
console = Console(width=150)


def _cache_file(tag: str, steps: int) -> Path:
    code = "".join((REPO / "src/gpemu/cost" / f).read_text() for f in ("model.py", "calibrate.py", "registry.py"))
    code += "".join((REPO / "src/gpemu/hardware" / f).read_text() for f in ("gpus.toml", "spec.py"))  # the specs fit
    digest = hashlib.sha1(f"{tag}|{steps}|{DATA.stat().st_size}|{code}|{torch.__version__}".encode()).hexdigest()[:16]
    return cache_dir() / "predict_validation" / f"{digest}.json"


def _fit_cached(tag: str, rows: pd.DataFrame, steps: int, use_cache: bool, per_gpu: bool = True) -> CostParams:
    path = _cache_file(tag, steps)
    if use_cache and path.exists():
        d = json.loads(path.read_text())
        return CostParams(d["shared"], d["per_gpu"], note=d["note"])  # fp32 rows: tensor cores play no part
    params = fit(rows, steps=steps, per_gpu=per_gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(params.to_json()))
    return params


def _predict_rows(rows: pd.DataFrame, params: CostParams, gpu: str, use_per_gpu: bool) -> pd.DataFrame:
    """Return rows of one GPU with a `pred` column from the spec model."""
    spec = get_gpu(gpu)
    parts = []
    for (workload, phase), sel in rows.groupby(["workload", "phase"]):
        sel = sel.copy()
        sel["pred"] = model_phase_seconds(spec, str(workload), str(phase), sel["batch_size"].to_numpy(), "fp32",
                                          params, use_per_gpu)
        parts.append(sel)
    return pd.concat(parts)


def _errors(df: pd.DataFrame, pred_col: str = "pred") -> dict[str, np.ndarray]:
    """Return absolute % errors for forward, backward and forward+backward (rows where both phases are measured)."""
    df = df.dropna(subset=[pred_col])
    out = {}
    for phase in ("forward", "backward"):
        sel = df[df["phase"] == phase]
        out[phase] = (sel[pred_col] / sel["value"] - 1).abs().to_numpy() * 100
    wide = df.pivot_table(index=["gpu", "workload", "batch_size"], columns="phase", values=["value", pred_col])
    wide = wide.dropna()
    total_pred = wide[(pred_col, "forward")] + wide[(pred_col, "backward")]
    total = wide[("value", "forward")] + wide[("value", "backward")]
    out["sum"] = ((total_pred / total - 1).abs() * 100).to_numpy()
    return out


def _row(table: Table, label: str, errs: dict[str, np.ndarray]) -> None:
    cells = []
    for phase in ("forward", "backward", "sum"):
        e = errs[phase]
        cells += [f"{np.median(e):.1f}", f"{np.percentile(e, 90):.1f}"] if len(e) else ["-", "-"]
    table.add_row(label, *cells, str(len(errs["sum"])))


def _table(title: str) -> Table:
    table = Table(title=title)
    table.add_column("held out / path")
    for phase in ("fwd", "bwd", "sum"):
        table.add_column(f"{phase} med %", justify="right")
        table.add_column(f"{phase} p90 %", justify="right")
    table.add_column("rows (sum)", justify="right")
    return table


def leave_one_gpu_out(rows: pd.DataFrame, steps: int, use_cache: bool, per_gpu: bool = True) -> pd.DataFrame:
    """Return per-row predictions for each held-out GPU: pred (spec), pred_closest, pred_from_<X>."""
    gpus = sorted(rows["gpu"].unique())
    out = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("leave-one-GPU-out fits", total=len(gpus))
        for held in gpus:
            train = rows[rows["gpu"] != held]
            params = _fit_cached(f"logo-{held}-{per_gpu}", train, steps, use_cache, per_gpu)
            # the held-out GPU is not in the fit: it borrows the nearest fitted GPU's factors, as predict_phase does
            test = _predict_rows(rows[rows["gpu"] == held], params, held, use_per_gpu=True)
            others = sorted(g for g in gpus if g != held)
            by_dist = sorted(others, key=lambda g: source_distance(get_gpu(held), get_gpu(g)))
            test = test.set_index(["workload", "phase", "batch_size"])
            held_rows = rows[rows["gpu"] == held]
            for x in others:
                xr = _predict_rows(rows[rows["gpu"] == x], params, x, use_per_gpu=True)
                xr = xr.set_index(["workload", "phase", "batch_size"])
                # as predict_phase does: the held-out GPU borrows X's factors (Note [Borrowed factors])
                borrowed = _predict_rows(held_rows, borrow_factors(params, held, x), held, use_per_gpu=True)
                borrowed = borrowed.set_index(["workload", "phase", "batch_size"])["pred"]
                test[f"spec_with_{x}"] = borrowed.reindex(test.index)
                model_y = borrowed.reindex(xr.index)
                scaled = xr["value"] * model_y / xr["pred"]
                test[f"pred_from_{x}"] = scaled.reindex(test.index)
            # as predict_phase chooses: the nearest GPU that measured this workload and phase, scaled where it has the
            # batch size, else the spec model (Note [Nearest source or the spec model] in predict.py)
            closest = test["pred"].copy()
            for (workload, phase), idx in test.groupby(level=["workload", "phase"]).groups.items():
                have = [x for x in by_dist if ((rows["gpu"] == x) & (rows["workload"] == workload)
                                                & (rows["phase"] == phase)).any()]
                if have:
                    col = test.loc[idx, f"pred_from_{have[0]}"]
                    closest.loc[idx] = col.where(col.notna(), test.loc[idx, "pred"])
            test["pred_closest"] = closest
            # every measured GPU's scaled prediction, combined by the median of their logs (robust to one bad source)
            scaled_cols = test[[f"pred_from_{x}" for x in others]]
            test["pred_median"] = np.exp(np.log(scaled_cols).median(axis=1, skipna=True))
            out.append(test.reset_index())
            bar.advance(task)
    return pd.concat(out)


SPARSE_BATCHES = (1, 16, 64, 256)  # the H200 profile's batch sizes (src/gpemu/profiles/builtin/h200-sxm-141gb.csv)


def sparse_source(logo: pd.DataFrame) -> pd.DataFrame:
    """Return, for held-out rows at batch sizes between SPARSE_BATCHES, the nearest source's prediction as if that
    source had measured only SPARSE_BATCHES: its measured / model ratio interpolated log-log (as predict_phase does:
    Note [Between the source's measured batch sizes]), the spec model (the fallback before session 15), and the exact
    scaled prediction (the source measured at that batch)."""
    gpus = sorted(logo["gpu"].unique())
    by_source = {g: min((x for x in gpus if x != g), key=lambda x: source_distance(get_gpu(g), get_gpu(x)))
                 for g in gpus}
    out = []
    for (gpu, _workload, _phase), sel in logo.groupby(["gpu", "workload", "phase"]):
        x = by_source[gpu]
        sel = sel.dropna(subset=[f"pred_from_{x}"]).sort_values("batch_size")
        batch = sel["batch_size"].to_numpy()
        ratio = (sel[f"pred_from_{x}"] / sel[f"spec_with_{x}"]).to_numpy()
        have = np.isin(batch, SPARSE_BATCHES)
        if have.sum() < 2:
            continue
        between = ~have & (batch > batch[have].min()) & (batch < batch[have].max())
        r = np.exp(np.interp(np.log(batch[between]), np.log(batch[have]), np.log(ratio[have])))
        part = sel[between].copy()
        part["pred_interp"] = part[f"spec_with_{x}"].to_numpy() * r
        part["pred_exact"] = part[f"pred_from_{x}"]
        out.append(part)
    return pd.concat(out)


def leave_models_out(rows: pd.DataFrame, steps: int, folds: int, use_cache: bool) -> pd.DataFrame:
    """Return per-row spec-model predictions for models held out of the fit (k folds over models)."""
    models = sorted(rows["workload"].unique())
    out = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("leave-models-out fits", total=folds)
        for k in range(folds):
            held = models[k::folds]
            params = _fit_cached(f"lmo-{folds}-{k}", rows[~rows["workload"].isin(held)], steps, use_cache)
            test_rows = rows[rows["workload"].isin(held)]
            for gpu in sorted(test_rows["gpu"].unique()):
                out.append(_predict_rows(test_rows[test_rows["gpu"] == gpu], params, gpu, use_per_gpu=True))
            bar.advance(task)
    return pd.concat(out)


def profile_lookup_errors(rows: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """Return absolute % errors of ProfileDB lookups with each measured row of the fit grid left out of its series:
    "interpolated" (an inner batch size, from its neighbours) and "extrapolated" (the smallest or largest)."""
    out: dict[str, dict[str, list[float]]] = {"interpolated": {}, "extrapolated": {}}
    grid = rows[rows["batch_size"].isin(FIT_BATCHES)]
    for (gpu, workload, phase), grp in grid.groupby(["gpu", "workload", "phase"]):
        grp = grp.sort_values("batch_size")
        if len(grp) < 3:
            continue
        table = pd.DataFrame({"gpu": gpu, "workload": workload, "phase": phase, "batch_size": grp["batch_size"],
                              "dtype": "fp32", "value": grp["value"], "unit": "s", "measured": 1,
                              "source": "held-out check"})
        for i in range(len(table)):
            db = ProfileDB.from_rows(table.drop(table.index[i]))
            est = db.lookup(str(gpu), str(workload), str(phase), int(table["batch_size"].iloc[i]), warn=False)
            bucket = out[est.kind].setdefault(str(phase), [])
            bucket.append(abs(est.value / float(table["value"].iloc[i]) - 1) * 100)
    return {kind: {ph: np.array(v) for ph, v in by_phase.items()} for kind, by_phase in out.items()}


def _figures(errs: np.ndarray) -> dict[str, float | int]:
    return {"median_abs_pct": round(float(np.median(errs)), 2), "p90_abs_pct": round(float(np.percentile(errs, 90)), 2),
            "rows": len(errs)}


def write_expected_error(path: Path, rows: pd.DataFrame, lookups: dict[str, dict[str, np.ndarray]],
                         logo: pd.DataFrame, lmo: pd.DataFrame | None, steps: int) -> None:
    """Write the per-path errors to expected_error.json, keeping its published-data entries (Note [Expected error])."""
    old = json.loads(path.read_text()) if path.exists() else {}
    paths = {k: v for k, v in old.get("paths", {}).items() if k.startswith("published")}
    gpus = ", ".join(sorted(rows["gpu"].unique()))
    paths["profile-interpolation"] = {
        "basis": "each measured row of the GPEmu profiles (batch 1, 2, 4, ..., 256) left out and interpolated "
                 "from its neighbours",
        **{ph: _figures(e) for ph, e in lookups["interpolated"].items()}}
    paths["profile-extrapolation"] = {
        "basis": "the smallest / largest measured batch size of each series left out and extrapolated from the rest",
        **{ph: _figures(e) for ph, e in lookups["extrapolated"].items()}}
    for key, col, basis in (
            ("scaled-from", "pred_closest", f"leave-one-GPU-out over {gpus}: the held-out GPU scaled from the "
                                            "nearest GPU that measured the model"),
            ("spec-model", "pred", f"leave-one-GPU-out over {gpus}: the held-out GPU from its spec and the "
                                   "nearest fitted GPU's factors")):
        errs = _errors(logo, col)
        paths[key] = {"basis": basis, **{ph: _figures(errs[ph]) for ph in ("forward", "backward", "sum")}}
    if lmo is not None and len(lmo):
        errs = _errors(lmo)
        paths["spec-model, unseen model"] = {
            "basis": "leave-models-out (5 folds over the GPEmu models): models the fit never saw, from the spec",
            **{ph: _figures(errs[ph]) for ph in ("forward", "backward", "sum")}}
    elif "spec-model, unseen model" in old.get("paths", {}):
        paths["spec-model, unseen model"] = old["paths"]["spec-model, unseen model"]
    table = {
        "note": f"bench/predict_validation.py --write ({steps}-step fold fits), "
                f"{time.strftime('%Y-%m-%d')}, on {len(rows)} measured fp32 rows of GPEmu's ROWS.csv",
        "fitted_sha256": fitted_sha256(),
        "models": sorted(rows["workload"].unique()),
        "paths": paths,
        # the published writers' entries (published_validation, llm_foundry_validation, timm_infer_validation)
        **{k: v for k, v in old.items() if k.startswith("published")},
    }
    path.write_text(json.dumps(table, indent=1) + "\n")
    console.print(f"wrote {path}")


def main() -> None:
    """Run both validations and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="optimiser steps per fit (default 120)")
    parser.add_argument("--folds", type=int, default=5, help="model folds for leave-models-out (default 5)")
    parser.add_argument("--no-cache", action="store_true", help="refit even when a cached fold fit exists")
    parser.add_argument("--no-per-gpu", action="store_true", help="LOGO fits without per-GPU factors")
    parser.add_argument("--skip-lmo", action="store_true", help="skip the leave-models-out part")
    parser.add_argument("--write", action="store_true",
                        help=f"store each path's errors in {EXPECTED_ERROR_PATH.relative_to(REPO)}")
    args = parser.parse_args()
    if not DATA.exists():
        raise SystemExit(f"shared data not found: {DATA}")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    rows = load_measured_rows(DATA)
    console.print(f"{len(rows)} measured forward/backward rows, {rows['gpu'].nunique()} GPUs, "
                  f"{rows['workload'].nunique()} models")

    logo = leave_one_gpu_out(rows, args.steps, not args.no_cache, per_gpu=not args.no_per_gpu)
    table = _table("Leave-one-GPU-out: absolute % error on the held-out GPU")
    gpus = sorted(logo["gpu"].unique())
    by_source = {g: min((x for x in gpus if x != g), key=lambda x: source_distance(get_gpu(g), get_gpu(x)))
                 for g in gpus}
    for held in gpus:
        sel = logo[logo["gpu"] == held]
        _row(table, f"{held}: spec-model", _errors(sel, "pred"))
        _row(table, f"{held}: scaled-from nearest ({by_source[held]})", _errors(sel, "pred_closest"))
        _row(table, f"{held}: scaled-from all (median)", _errors(sel, "pred_median"))
    _row(table, "ALL: spec-model", _errors(logo, "pred"))
    _row(table, "ALL: scaled-from nearest", _errors(logo, "pred_closest"))
    _row(table, "ALL: scaled-from all (median)", _errors(logo, "pred_median"))
    console.print(table)
    errs = _errors(logo, "pred_closest")
    console.print("acceptance (#5: held-out GPU scaled from the nearest, median <= 8 %, p90 <= 20 %), two decimals: "
                  + ", ".join(f"{ph} {np.median(e):.2f} / {np.percentile(e, 90):.2f}" for ph, e in errs.items()))

    pairs = _table("Leave-one-GPU-out: scaled from each measured GPU X (rows = held-out Y <- X)")
    for held in sorted(logo["gpu"].unique()):
        sel = logo[logo["gpu"] == held]
        for col in sorted(c for c in logo.columns if c.startswith("pred_from_")):
            if sel[col].notna().any():
                _row(pairs, f"{held} <- {col.removeprefix('pred_from_')}", _errors(sel.dropna(subset=[col]), col))
    console.print(pairs)

    # where the tail lives: small batches are bound by the measuring host's dispatch, which a held-out GPU's machine
    # does not share (docs/cost-model.md, session 7); large ones by the GPU
    regimes = _table("Leave-one-GPU-out, scaled from nearest, by batch size (host-bound small batches vs GPU-bound)")
    for label, lo, hi in (("batch 1-8", 1, 8), ("batch 9-64", 9, 64), ("batch 65-256", 65, 256),
                          ("batch > 256", 257, 1 << 30)):
        sel = logo[(logo["batch_size"] >= lo) & (logo["batch_size"] <= hi)]
        if len(sel):
            _row(regimes, label, _errors(sel, "pred_closest"))
    console.print(regimes)

    sparse = sparse_source(logo)
    table = _table(f"Leave-one-GPU-out, the nearest source thinned to batch {', '.join(map(str, SPARSE_BATCHES))} "
                   "(rows between them)")
    _row(table, "interpolated source ratio (since session 15)", _errors(sparse, "pred_interp"))
    _row(table, "spec model (before)", _errors(sparse, "pred"))
    _row(table, "source measured at the batch (for reference)", _errors(sparse, "pred_exact"))
    console.print(table)

    if args.skip_lmo:
        lmo = logo.iloc[0:0].assign(pred=np.nan)
    else:
        lmo = leave_models_out(rows, args.steps, args.folds, not args.no_cache)
        table = _table(f"Leave-models-out ({args.folds} folds over models): spec-model with per-GPU factors")
        _row(table, "ALL", _errors(lmo))
        console.print(table)

    worst = Table(title="Per-model worst cases (median abs % error of fwd+bwd; LOGO spec / LOGO nearest / LMO)")
    for col in ("model", "LOGO spec med", "LOGO nearest med", "LMO med", "worst GPU (LOGO spec)"):
        worst.add_column(col)
    records = []
    for model in sorted(rows["workload"].unique()):
        a = logo[logo["workload"] == model]
        b = lmo[lmo["workload"] == model]
        spec_e, close_e = _errors(a, "pred")["sum"], _errors(a, "pred_closest")["sum"]
        lmo_e = _errors(b)["sum"] if len(b) else np.array([np.nan])
        per_gpu = {g: np.median(_errors(a[a["gpu"] == g], "pred")["sum"]) for g in a["gpu"].unique()
                   if len(_errors(a[a["gpu"] == g], "pred")["sum"])}
        bad = max(per_gpu, key=lambda g: per_gpu[g]) if per_gpu else "-"
        records.append((np.median(spec_e), model, np.median(close_e), np.median(lmo_e),
                        f"{bad} ({per_gpu.get(bad, float('nan')):.0f}%)"))
    for spec_med, model, close_med, lmo_med, bad in sorted(records, reverse=True):
        worst.add_row(model, f"{spec_med:.1f}", f"{close_med:.1f}", f"{lmo_med:.1f}", bad)
    console.print(worst)
    lookups = profile_lookup_errors(rows)
    table = _table("Profile lookups: each measured row left out of its series (ProfileDB)")
    for kind, by_phase in lookups.items():
        table.add_row(kind, *[c for ph in ("forward", "backward") for c in (
            f"{np.median(by_phase[ph]):.1f}", f"{np.percentile(by_phase[ph], 90):.1f}")], "-", "-",
            str(sum(len(v) for v in by_phase.values())))
    console.print(table)
    if args.write:
        write_expected_error(EXPECTED_ERROR_PATH, rows, lookups, logo, None if args.skip_lmo else lmo, args.steps)
    console.print(f"done in {time.perf_counter() - t0:.0f} s (fits: {args.steps} steps; cache: "
                  f"{'off' if args.no_cache else 'on'})")


if __name__ == "__main__":
    main()
