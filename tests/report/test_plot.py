"""Plots of run reports (Note [Iteration plot]): the stacked columns, the image, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpemu.errors import GpemuError
from gpemu.report.plot import iteration_series, load_report, plot_reports


def _report() -> dict[str, object]:
    rows = [
        # 100 ms wall: 60 busy, 30 idle while the host waited for data, so 100 - 60 - 30 = 10 ms other idle
        {"wall_s": 0.100, "gpu_busy_s": 0.060, "gpu_idle_s": 0.040, "gpu_idle_data_s": 0.030, "train": True},
        # an evaluation iteration closed at the final sync: 50 ms, all busy
        {"wall_s": 0.050, "gpu_busy_s": 0.050, "gpu_idle_s": 0.0, "gpu_idle_data_s": 0.0, "train": False,
         "partial": True},
        # a data wait longer than the idle time it could overlap (an older report): clamped to wall - busy = 5 ms
        {"wall_s": 0.020, "gpu_busy_s": 0.015, "gpu_idle_s": 0.005, "gpu_idle_data_s": 0.009},
    ]
    return {"gpu": "a100-sxm4-80gb", "model": "resnet50", "warmup_iterations": 1, "iterations": rows,
            "summary": {"gpu_busy_pct": 73.0, "fetch_stall_pct": 18.0}}


def test_each_iteration_splits_its_wall_time_into_busy_data_and_other() -> None:
    s = iteration_series(_report(), "r")
    assert s.busy_ms == pytest.approx([60.0, 50.0, 15.0])
    assert s.idle_data_ms == pytest.approx([30.0, 0.0, 5.0])
    assert s.idle_other_ms == pytest.approx([10.0, 0.0, 0.0])
    assert s.wall_ms == pytest.approx([100.0, 50.0, 20.0])  # the stack's height is the wall time
    assert s.train == [True, False, True] and s.partial == [False, True, False] and s.warmup == 1
    assert (s.gpu_busy_pct, s.fetch_stall_pct) == (73.0, 18.0)


def test_two_reports_side_by_side_make_one_image(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_reports([("0 workers", _report()), ("2 workers", _report())], tmp_path / "sub" / "p.png", "title")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000  # a real raster, not an empty canvas


def test_bad_reports_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(GpemuError, match=r"bad\.json"):
        load_report(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"summary": {}}))
    with pytest.raises(GpemuError, match="--report-json"):
        load_report(other)
    with pytest.raises(GpemuError, match="no iterations"):
        iteration_series({"iterations": []}, "empty")


def test_plot_command_writes_the_image_and_exits_2_on_a_missing_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = tmp_path / "r.json"
    report.write_text(json.dumps(_report()))
    out = tmp_path / "p.svg"
    ok = subprocess.run([sys.executable, "-m", "gpemu", "plot", str(report), "-o", str(out)], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert out.read_text().lstrip().startswith("<?xml")
    missing = subprocess.run([sys.executable, "-m", "gpemu", "plot", str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "none.json" in missing.stdout + missing.stderr
    assert "Traceback" not in missing.stderr
