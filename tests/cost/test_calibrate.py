"""Tests for gpemu.cost.calibrate: loading GPEmu's measured rows and fitting reduces the error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpemu.cost.calibrate import fit, load_measured_rows
from gpemu.cost.model import DEFAULT_SHARED, CostParams
from gpemu.cost.predict import model_phase_seconds
from gpemu.hardware import get_gpu


def _median_abs_error_pct(rows: pd.DataFrame, params: CostParams) -> float:
    errs = []
    for (workload, phase, gpu), sel in rows.groupby(["workload", "phase", "gpu"]):
        pred = model_phase_seconds(get_gpu(str(gpu)), str(workload), str(phase), sel["batch_size"].to_numpy(),
                                   "fp32", params)
        errs.append(np.abs(pred / sel["value"].to_numpy() - 1) * 100)
    return float(np.median(np.concatenate(errs)))


def test_rows_load_with_catalog_keys_and_measured_only(shared_data: Path) -> None:
    rows = load_measured_rows(shared_data / "gpemu-profiles" / "ROWS.csv")
    assert set(rows["gpu"]) == {"k80", "m40", "p100-pcie-16gb", "v100-pcie-32gb", "quadro-rtx-6000"}
    assert set(rows["phase"]) == {"forward", "backward"}
    assert len(rows) == 57842  # measured=1 forward + backward rows in ROWS.csv (fwd 6538+4877+4802+5630+7068 + bwd 6538+4880+4811+5630+7068)


def test_fit_beats_the_priors(shared_data: Path) -> None:
    rows = load_measured_rows(shared_data / "gpemu-profiles" / "ROWS.csv")
    rows = rows[rows["workload"].isin(["alexnet", "squeezenet1_1"]) & (rows["gpu"] == "v100-pcie-32gb")]
    fitted = fit(rows, steps=40)
    prior = CostParams(dict(DEFAULT_SHARED))
    assert _median_abs_error_pct(rows, fitted) < 0.5 * _median_abs_error_pct(rows, prior)


def test_a_targeted_refit_moves_only_the_named_constants(shared_data: Path) -> None:
    import pytest

    from gpemu.cost.model import load_params
    from gpemu.errors import GpemuError

    rows = load_measured_rows(shared_data / "gpemu-profiles" / "ROWS.csv")
    rows = rows[rows["workload"].isin(["mobilenet_v2", "resnext101_32x8d"]) & (rows["gpu"] == "v100-pcie-32gb")]
    start = load_params()
    refit = fit(rows, steps=15, free=["e_grouped", "group_width_half"], start=start)
    moved = {k for k in start.shared if not np.isclose(refit.shared[k], start.shared[k], rtol=1e-12)}
    # Note [Targeted refits]: only the named constants (and the per-GPU factors) move, from the packaged values
    assert moved <= {"e_grouped", "group_width_half"} and "e_grouped" in moved
    with pytest.raises(GpemuError, match="unknown shared constant 'e_groupd'; did you mean e_grouped"):
        fit(rows, steps=1, free=["e_groupd"], start=start)


def test_fit_gpu_recovers_a_uniformly_slower_gpu() -> None:
    # Note [Fitting a newly measured GPU]: rows made by the model itself for an H100, every figure 1.3x slower, fp32
    # and amp; fitting only that GPU's factors (shared constants frozen) brings the error from 30 % to a few %.
    from gpemu.cost.calibrate import fit_gpu
    from gpemu.cost.model import load_params

    spec = get_gpu("h100-sxm5-80gb")
    batches = [16, 64, 256]
    records = []
    for dtype in ("fp32", "amp"):
        for phase in ("forward", "backward"):
            pred = model_phase_seconds(spec, "resnet18", phase, batches, dtype)
            records += [{"gpu": spec.key, "workload": "resnet18", "phase": phase, "batch_size": b, "dtype": dtype,
                         "value": 1.3 * v, "measured": 1} for b, v in zip(batches, pred, strict=True)]  # fmt: skip
    rows = pd.DataFrame(records)
    factors = fit_gpu(rows, "h100", batches=batches, steps=150)
    base = load_params()
    from dataclasses import replace

    fitted = replace(base, per_gpu={**base.per_gpu, spec.key: factors})
    assert set(factors) == {"a", "b", "c", "t"}
    errs = [abs(model_phase_seconds(spec, "resnet18", r["phase"], [r["batch_size"]], r["dtype"], fitted)[0]
                / r["value"] - 1) for r in records]  # fmt: skip
    assert float(np.median(errs)) < 0.06
