"""`gpemu demo` smoke test with tiny sizes, profile resolution, and bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpemu.cli.demo_cmd import print_summary, resolve_profile_db, run_explicit
from gpemu.hardware import get_gpu


def test_explicit_demo_tiny(tmp_path: Path) -> None:
    results = run_explicit(
        get_gpu("v100"), "resnet50", batch_size=4, workers=[0], iters=3, data_dir=tmp_path / "jpeg",
        report_json=tmp_path / "r.json", quiet=True,
    )
    (r,) = results
    assert r["workers"] == 0
    assert r["iterations_total"] == 3
    # Every iteration decodes 4 real JPEGs (data wait > 0) and runs forward + backward on the emulated GPU.
    assert r["data_wait_s"]["mean"] > 0
    assert r["gpu_busy_s"]["mean"] > 0
    assert 0 < r["gpu_busy_pct"] < 100
    assert (tmp_path / "r-w0.json").is_file()
    print_summary(results)  # renders without error


def test_profile_comes_from_shared_data_when_present(shared_data: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path / "empty-user-dir"))
    from gpemu.profiles import ProfileDB

    ProfileDB.clear_cache()
    try:
        db, provenance = resolve_profile_db(get_gpu("v100"), "resnet50", tmp_path)
        est = db.lookup("v100", "resnet50", "forward", 128)
        assert "imported" in provenance
        assert est.kind == "measured" and est.value == pytest.approx(0.1193, abs=1e-4)  # GPEmu's measured row
    finally:
        ProfileDB.clear_cache()


def test_bad_mode_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpemu", "demo", "--mode", "explicitt"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "explicit" in proc.stderr and "Traceback" not in proc.stderr
