"""Tests for `gpemu gpus`, `models`, `import-gpemu` and `predict` (JSON shape, sources, bad input -> exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpemu.cli.app import _register, app
from gpemu.profiles import ProfileDB, rows_from_records, write_profile_csv

_register()
runner = CliRunner()


@pytest.fixture
def profile_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user profile dir as $GPEMU_PROFILE_DIR (the default DB cache is cleared around the test)."""
    path = tmp_path / "profiles"
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(path))
    monkeypatch.setattr("gpemu.profiles.db.builtin_profile_paths", lambda: [])
    ProfileDB.clear_cache()
    yield path
    ProfileDB.clear_cache()


@pytest.fixture
def imported(shared_data: Path, tmp_path: Path, profile_dir: Path) -> Path:
    """The K80 and V100 resnet50 part of the shared GPEmu tree, imported through the CLI into profile_dir."""
    src = shared_data / "gpemu-profiles"
    tree = tmp_path / "tree"
    for f in src.rglob("*"):
        if f.is_file() and f.parent.name == "resnet50" and f.parent.parent.name in ("Tesla_K80", "Tesla_V100-PCIE-32GB"):
            (tree / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, tree / f.relative_to(src))
    result = runner.invoke(app, ["import-gpemu", str(tree)])
    assert result.exit_code == 0, result.output
    assert "v100-pcie-32gb" in result.stdout and "k80" in result.stdout
    return profile_dir


def _predict(*args: str) -> dict:
    result = runner.invoke(app, ["predict", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_gpus_lists_the_catalog() -> None:
    result = runner.invoke(app, ["gpus"])
    assert result.exit_code == 0
    for text in ("v100-pcie-32gb", "Tesla K80", "NVIDIA H100 80GB HBM3", "b200", "gen3 x16"):
        assert text in result.stdout


def test_predict_acceptance(imported: Path) -> None:
    out = _predict("--gpu", "v100", "--model", "resnet50", "--batch-size", "128")
    assert set(out) == {"gpu", "model", "batch_size", "dtype", "memory_format", "mode", "seq_len", "phases", "memory",
                        "published_bias"}
    assert out["seq_len"] is None  # an image model
    assert (out["gpu"], out["model"], out["batch_size"], out["dtype"]) == ("v100-pcie-32gb", "resnet50", 128, "fp32")
    assert out["memory_format"] == "nchw"
    assert set(out["phases"]) == {"forward", "backward", "h2d"}
    assert round(out["phases"]["forward"]["seconds"], 4) == 0.1193
    assert round(out["phases"]["backward"]["seconds"], 4) == 0.2655
    assert {p["source"] for p in out["phases"].values()} == {"measured"}
    assert set(out["memory"]) >= {"peak_mib", "persistent_mib", "source"}
    k80 = _predict("--gpu", "Tesla_K80", "--model", "resnet50", "--batch-size", "200")
    assert k80["phases"]["forward"]["source"] == "extrapolated"
    assert k80["phases"]["backward"]["source"] == "extrapolated"


def test_predict_channels_last_scales_the_nchw_profile(imported: Path) -> None:
    # Profiles are NCHW: a channels_last request is the measured row times model(NHWC) / model(NCHW) on the same GPU
    # (Note [Layout cost]). fp32 on a V100 runs NCHW-native CUDA-core kernels, so NHWC pays transposes: slower.
    out = _predict("--gpu", "v100", "--model", "resnet50", "--batch-size", "128", "--memory-format", "channels_last")
    assert out["memory_format"] == "channels_last"
    fwd = out["phases"]["forward"]
    assert fwd["path"] == "scaled-from:v100-pcie-32gb" and fwd["seconds"] > 0.1193  # the measured NCHW forward
    result = runner.invoke(app, ["predict", "-g", "v100", "-m", "resnet50", "-b", "8", "--memory-format", "nhwc"])
    assert result.exit_code != 0 and "channels_last" in result.output


def test_predict_infer_mode_scales_the_training_forward(imported: Path) -> None:
    # Note [Inference forward]: an eval-mode, no_grad forward is the measured training forward (0.1193 s) times
    # model(inference) / model(training forward) on the same GPU: batch norm reads x once less, no bookkeeping ops
    out = _predict("--gpu", "v100", "--model", "resnet50", "--batch-size", "128", "--mode", "infer")
    assert out["mode"] == "infer" and set(out["phases"]) == {"inference", "h2d"}
    inf = out["phases"]["inference"]
    assert inf["path"] == "scaled-from:v100-pcie-32gb" and 0.09 < inf["seconds"] < 0.1193
    result = runner.invoke(app, ["predict", "-g", "v100", "-m", "resnet50", "-b", "8", "--mode", "eval"])
    assert result.exit_code == 2 and "infer, train" in result.output


def test_predict_interpolates_in_a_profile_with_gaps(profile_dir: Path) -> None:
    rows = [
        {"gpu": "t4", "workload": "toy", "phase": phase, "batch_size": b, "dtype": "fp32", "value": v * scale,
         "unit": "s", "measured": 1, "source": "hand"}
        for phase, scale in (("forward", 1.0), ("backward", 2.0))
        for b, v in ((32, 0.1), (64, 0.2))
    ]  # fmt: skip
    write_profile_csv(rows_from_records(rows), profile_dir / "toy.csv")
    out = _predict("--gpu", "t4", "--model", "toy", "--batch-size", "48")
    assert out["phases"]["forward"]["source"] == "interpolated"
    assert out["phases"]["forward"]["seconds"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2, halfway from 32 to 64
    assert out["phases"]["backward"]["seconds"] == pytest.approx(0.30)  # 2 * 0.15
    # no h2d row: 48 * 3*224*224*4 bytes / 4.3e9 B/s (T4 pageable, gpus.toml) = 0.0067213...
    assert out["phases"]["h2d"]["source"] == "predicted"
    assert out["phases"]["h2d"]["path"] == "spec-h2d-bandwidth"
    assert out["phases"]["h2d"]["seconds"] == pytest.approx(48 * 602112 / 4.3e9)


def test_table_output_names_sources(imported: Path) -> None:
    result = runner.invoke(app, ["predict", "-g", "v100", "-m", "resnet50", "-b", "64"])
    assert result.exit_code == 0
    assert "measured" in result.stdout and "forward" in result.stdout


def test_models_lists_profiled_workloads(imported: Path) -> None:
    result = runner.invoke(app, ["models", "--gpu", "Tesla_K80"])
    assert result.exit_code == 0
    # K80 resnet50 forward/backward measured at 1..126 (GPEmu filled 127..256)
    assert "resnet50" in result.stdout and "1..126 (126)" in result.stdout
    assert "v100" not in result.stdout


@pytest.mark.parametrize(
    ("description", "args", "message"),
    [
        ("unknown gpu", ["--gpu", "v1000", "--model", "resnet50", "--batch-size", "8"], "did you mean"),
        ("unknown model", ["--gpu", "v100", "--model", "resnet5O", "--batch-size", "8"], "resnet50"),
        ("zero batch", ["--gpu", "v100", "--model", "resnet50", "--batch-size", "0"], ">= 1"),
        ("negative batch", ["--gpu", "v100", "--model", "resnet50", "--batch-size", "-3"], ">= 1"),
        ("fractional batch", ["--gpu", "v100", "--model", "resnet50", "--batch-size", "1.5"], "integer"),
        ("unknown dtype", ["--gpu", "v100", "--model", "resnet50", "--batch-size", "8", "--dtype", "fp33"], "fp32"),
    ],
)
def test_bad_input_exits_2_without_traceback(profile_dir: Path, description: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["predict", *args])
    assert result.exit_code == 2, description
    assert message in result.output, description
    assert "Traceback" not in result.output, description


def test_import_of_a_missing_folder_exits_2(profile_dir: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["import-gpemu", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "not found" in result.output


def test_h2d_of_another_dtype_uses_the_fp32_input_copy(profile_dir: Path) -> None:
    rows = [
        {"gpu": "t4", "workload": "toy", "phase": "h2d_pageable", "batch_size": 16, "dtype": "fp32", "value": 0.004,
         "unit": "s", "measured": 1, "source": "hand"},
        {"gpu": "t4", "workload": "toy", "phase": "forward", "batch_size": 16, "dtype": "amp", "value": 0.01,
         "unit": "s", "measured": 1, "source": "hand"},
    ]  # fmt: skip
    write_profile_csv(rows_from_records(rows), profile_dir / "toy.csv")
    out = _predict("--gpu", "t4", "--model", "toy", "--batch-size", "16", "--dtype", "amp")
    assert out["phases"]["forward"]["seconds"] == 0.01
    assert (out["phases"]["h2d"]["seconds"], out["phases"]["h2d"]["source"]) == (0.004, "measured")
    assert "fp32 row" in out["phases"]["h2d"]["provenance"]
