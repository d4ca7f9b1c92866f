"""Tests for gpemu.profiler.validate: loading run reports and the per-iteration error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpemu.errors import GpemuError
from gpemu.profiler.validate import compare_runs, load_iterations


@pytest.mark.parametrize(
    ("description", "payload"),
    [
        ("run report object", {"iterations": [{"wall_s": 0.5, "h2d_s": 0.1}, {"wall_s": 0.25}]}),
        ("list of objects", [{"wall_s": 0.5}, {"wall_s": 0.25}]),
        ("plain list", [0.5, 0.25]),
    ],
)
def test_load_iterations_formats(tmp_path: Path, description: str, payload: object) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(payload))
    assert load_iterations(path) == [0.5, 0.25]


@pytest.mark.parametrize("text", ["{not json", '{"iters": []}', '[{"wall": 1}]', "[-1.0]", '["1"]'])
def test_malformed_reports_name_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(GpemuError, match=r"broken\.json"):
        load_iterations(path)


def test_compare_runs_numbers() -> None:
    real = [1.0, 0.1, 0.2, 0.1, 0.4]
    emu = [5.0, 0.11, 0.19, 0.1, 0.4]
    v = compare_runs(real, emu, warmup=1)
    assert v.n_compared == 4
    assert v.errors_pct == pytest.approx((10.0, -5.0, 0.0, 0.0))  # (0.11-0.1)/0.1, (0.19-0.2)/0.2, ...
    assert v.median_abs_error_pct == pytest.approx(2.5)  # |e| sorted 0, 0, 5, 10 -> (0 + 5) / 2
    assert v.p90_abs_error_pct == pytest.approx(8.5)  # index 0.9 * 3 = 2.7 -> 5 + 0.7 * 5
    assert v.mean_real_s == pytest.approx(0.2)  # 0.8 / 4
    assert v.mean_error_pct == pytest.approx(0.0)  # emulated also sums to 0.8


def test_compare_runs_uneven_and_empty() -> None:
    v = compare_runs([0.1, 0.2, 0.2], [0.1, 0.3], warmup=1)
    assert (v.n_real, v.n_emulated, v.n_compared) == (3, 2, 1)
    assert v.mean_error_pct == pytest.approx(50.0)  # 0.3 vs 0.2
    with pytest.raises(GpemuError, match="nothing to compare"):
        compare_runs([0.1], [0.1], warmup=1)
