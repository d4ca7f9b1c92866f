"""Tests for the `gpemu profile`, `gpemu profiles merge` and `gpemu validate` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpemu.cli.app import main
from gpemu.profiler.store import read_native_profile


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at the terminal width


def _run(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_profile_dry_run_then_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["profile", "--models", "tiny-mlp", "--batch-sizes", "1-2", "--dtype", "fp32", "--dry-run",
            "--warmup", "0", "--reps", "2", "--no-ops", "--no-transfers", "--gpu-name", "v100", "--out", str(out)]  # fmt: skip
    assert _run(argv) == 0
    assert "2 configuration(s) profiled" in _flat(capsys.readouterr().out)
    rows = read_native_profile(out / "v100-pcie-32gb.csv")
    assert len(rows) == 2 * 7  # 4 step phases + 3 memory rows per batch size; copies were switched off
    assert _run(["profiles", "merge", str(out), "--into", str(tmp_path / "db")]) == 0
    assert "14 added" in _flat(capsys.readouterr().out)
    assert _run(["profiles", "merge", str(out), "--into", str(tmp_path / "db")]) == 0
    assert "0 added, 0 replaced, 0 kept (existing newer or measured), 14 unchanged" in _flat(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "resnt18"], "resnet18"),
        (["--models", "tiny-cnn", "--batch-sizes", "0"], "batch-size spec"),
        (["--models", "tiny-cnn", "--dtype", "fp33"], "fp32"),
        (["--models", "tiny-cnn", "--fake-memory-mib", "1"], "--dry-run"),
    ],
)
def test_profile_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                   message: str) -> None:  # fmt: skip
    dry = [] if "--fake-memory-mib" in argv else ["--dry-run"]
    assert _run(["profile", *argv, *dry, "--out", str(tmp_path)]) == 2
    err = _flat(capsys.readouterr().err)
    assert message in err and "Traceback" not in err


def test_validate_table_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real, emu = tmp_path / "real.json", tmp_path / "emu.json"
    real.write_text(json.dumps({"iterations": [{"wall_s": v} for v in (1.0, 0.1, 0.2, 0.1, 0.4)]}))
    emu.write_text(json.dumps([5.0, 0.11, 0.19, 0.1, 0.4]))
    assert _run(["validate", "--gpu-run", str(real), "--emulated-run", str(emu)]) == 0
    table = capsys.readouterr().out
    assert "2.50 %" in table  # median |error|: 10, 5, 0, 0 -> 2.5
    assert "+0.00 %" in table  # error of the mean: both sum to 0.8 s
    assert _run(["validate", "--gpu-run", str(real), "--emulated-run", str(emu), "--json", "--warmup", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_compared"] == 5 and data["errors_pct"][0] == pytest.approx(400.0)  # 5.0 vs 1.0
    emu.write_text("{oops")
    assert _run(["validate", "--gpu-run", str(real), "--emulated-run", str(emu)]) == 2
    assert "emu.json" in _flat(capsys.readouterr().err)
