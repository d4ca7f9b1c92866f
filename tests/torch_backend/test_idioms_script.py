"""A timm/HF-style trainer (tests/torch_backend/scripts/timm_style_train.py) runs unmodified under `gpemu run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import gpemu_run_script

SCRIPT = Path(__file__).resolve().parent / "scripts" / "timm_style_train.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpemu", "run", "--gpu", "a100", "--report-json", str(tmp_path / "r.json"), "--",
         "python", str(SCRIPT), "--output", str(tmp_path / "out"), *args],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )


def test_train_then_resume_with_map_location(tmp_path: Path) -> None:
    first = _run(tmp_path, "--epochs", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "device cuda, params on cuda:0, NVIDIA A100-SXM4-80GB" in first.stdout
    assert "epoch 0 samples 64" in first.stdout and "epoch 1 samples 64" in first.stdout  # 64 = 8 batches of 8
    rows = json.loads((tmp_path / "r.json").read_text())["iterations"]
    assert len(rows) >= 8 and all(row["gpu_busy_s"] > 0 for row in rows)
    second = _run(tmp_path, "--epochs", "3", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "at epoch 2" in second.stdout and "epoch 2 samples 64" in second.stdout
    assert "epoch 1 samples" not in second.stdout and "done acc" in second.stdout


def test_a_launcher_exiting_after_its_worker_keeps_the_workers_trace(tmp_path: Path) -> None:
    # `gpemu run --trace t.json -- torchrun ...`: the launcher process is emulated too (it imports torch) and exits
    # last; its empty trace used to replace the worker's, as its idle report already did not
    done = gpemu_run_script(tmp_path, "launcher_then_worker.py", "--trace", str(tmp_path / "t.json"), timeout_s=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "worker done" in done.stdout and "launcher done" in done.stdout
    names = {e.get("name") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]}
    assert "mm.default" in names  # the worker's 256 x 256 matmul
