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


def test_a_real_gpu_run_is_never_drawn_as_an_idle_gpu() -> None:
    # `gpemu run --gpu real` measures no device activity (gpu_busy_s 0): its bars are the data wait (20 ms) and the
    # unmeasured rest (100 - 20 = 80 ms), and no GPU-busy figure is claimed
    real = {"gpu": "real NVIDIA A100-SXM4-80GB", "iterations": [
        {"wall_s": 0.100, "gpu_busy_s": 0.0, "gpu_idle_s": 0.100, "gpu_idle_data_s": 0.0, "data_wait_s": 0.020}],
        "summary": {"gpu_busy_pct": 0.0, "fetch_stall_pct": 20.0}}
    s = iteration_series(real, "real")
    assert not s.gpu_measured and s.gpu_busy_pct is None and s.fetch_stall_pct == 20.0
    assert (s.busy_ms, s.idle_data_ms, s.idle_other_ms) == ([0.0], pytest.approx([20.0]), pytest.approx([80.0]))


def test_validate_plot_draws_both_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gpemu.cli.app import main

    real, emu, out = tmp_path / "real.json", tmp_path / "emu.json", tmp_path / "v.png"
    real.write_text(json.dumps({**_report(), "gpu": "real NVIDIA A100-SXM4-80GB"}))
    emu.write_text(json.dumps(_report()))
    with pytest.raises(SystemExit) as done:
        main(["validate", "--gpu-run", str(real), "--emulated-run", str(emu), "--plot", str(out)])
    assert done.value.code == 0 and out.read_bytes()[:4] == b"\x89PNG"


def test_a_predict_sweep_runs_past_the_memory_limit_and_keeps_the_asked_batch() -> None:
    from gpemu.cli.catalog_cmds import SWEEP_MAX_BATCH, sweep_batches

    # powers of two to twice the asked 256 (512), on while the batch fits (1024), and one past (2048)
    assert sweep_batches(256, lambda b: b <= 1024) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert sweep_batches(100, lambda b: b <= 128) == [1, 2, 4, 8, 16, 32, 64, 100, 128, 256]
    assert sweep_batches(8, lambda b: True)[-1] == SWEEP_MAX_BATCH


def test_a_sweep_point_is_the_steps_samples_per_second_and_its_weakest_source() -> None:
    from gpemu.report.plot import plot_batch_sweep, sweep_point

    out = {"batch_size": 64, "mode": "train", "memory": {"peak_mib": 9000.0, "fits": True}, "phases": {
        "forward": {"seconds": 0.1, "source": "measured"},
        "backward": {"seconds": 0.3, "source": "interpolated", "expected_error": {"median_abs_pct": 7.0}},
        "h2d": {"seconds": 0.01, "source": "predicted"}}}
    p = sweep_point(out)
    # 64 samples / (0.1 + 0.3) s = 160 /s; the H2D copy alone: 64 / 0.01 s = 6400 /s
    assert p.samples_per_s == pytest.approx(160.0) and p.h2d_samples_per_s == pytest.approx(6400.0)
    assert (p.source, p.expected_abs_pct, p.fits) == ("interpolated", 7.0, True)
    pytest.importorskip("matplotlib")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        over = sweep_point({**out, "batch_size": 128, "memory": {"peak_mib": 99000.0, "fits": False}})
        png = plot_batch_sweep([p, over], 81050.0, Path(tmp) / "s.png", "title", asked_batch=64)
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_predict_memory_answers_past_the_device_under_autocast() -> None:
    # predict_memory simulates with unlimited capacity (its docstring); the autocast path used the device's and
    # raised its OOM: resnet50 amp at batch 512 allocates ~22 GB (22,132 MiB on an A100), more than a T4's 16 GB
    from gpemu.memory.predict import predict_memory

    mem = predict_memory("t4", "resnet50", 512, "amp")
    assert mem["fits"] is False and mem["peak_mib"] > 16 * 1024
