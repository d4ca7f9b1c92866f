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
