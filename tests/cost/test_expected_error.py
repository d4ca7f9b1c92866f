"""Expected error: each predicted figure carries the validation error of the path that produced it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpemu.cli.app import _register, app
from gpemu.cost.expected_error import (
    EXPECTED_ERROR_PATH,
    expected_error,
    fitted_sha256,
    load_table,
    published_bias,
    seen_models,
    table_key,
)
from gpemu.profiles import ProfileDB, rows_from_records
from gpemu.profiles.step import predict_step

_register()
runner = CliRunner()


def test_the_packaged_errors_were_measured_against_the_packaged_fit() -> None:
    table = load_table()
    assert table, f"{EXPECTED_ERROR_PATH} is missing: run bench/predict_validation.py --write"
    assert table["fitted_sha256"] == fitted_sha256(), (
        "fitted.json changed since the expected errors were measured: rerun `bench/predict_validation.py --write` "
        "and `bench/published_validation.py --write` (Note [Expected error])")
    for key in ("profile-interpolation", "profile-extrapolation", "scaled-from", "spec-model",
                "spec-model, unseen model", "published-models", "published-layers"):
        entry = table["paths"][key]
        for figures in (v for k, v in entry.items() if k != "basis"):
            assert 0 <= figures["median_abs_pct"] <= figures["p90_abs_pct"] and figures["rows"] > 0
    assert {"resnet50", "vgg16", "mobilenet_v2"} <= seen_models()


@pytest.mark.parametrize(("path", "kind", "dtype", "model_kind", "seen", "key"), [
    ("", "measured", "fp32", "vision", True, None),
    ("profile-interpolation", "interpolated", "fp32", "vision", True, "profile-interpolation"),
    ("profile-extrapolation", "extrapolated", "fp16", "vision", True, "profile-extrapolation"),
    ("scaled-from:v100-pcie-32gb", "predicted", "fp32", "vision", True, "scaled-from"),
    ("spec-model", "predicted", "fp32", "vision", True, "spec-model"),
    ("spec-model", "predicted", "fp32", "vision", False, "spec-model, unseen model"),
    ("spec-model", "predicted", "bf16", "lm", False, "published-layers"),  # no measured tensor-core rows
    ("scaled-from:v100-pcie-32gb", "predicted", "amp", "vision", True, "published-models"),
    ("spec-h2d-bandwidth", "predicted", "fp32", "vision", True, None),
])
def test_each_path_maps_to_its_validation(path: str, kind: str, dtype: str, model_kind: str, seen: bool,
                                          key: str | None) -> None:
    assert table_key(path, kind, dtype, model_kind, seen) == key


def test_predict_reports_the_spec_paths_error_for_an_unmeasured_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpemu.profiles.db.builtin_profile_paths", lambda: [])
    out = predict_step("h100", "resnet50", 64, db=ProfileDB.from_rows(rows_from_records([])))
    fwd, bwd = out["phases"]["forward"], out["phases"]["backward"]
    assert fwd["path"] == "spec-model"
    spec = load_table()["paths"]["spec-model"]  # resnet50 is in the fit: the leave-one-GPU-out spec figures
    assert fwd["expected_error"]["median_abs_pct"] == spec["forward"]["median_abs_pct"]
    assert bwd["expected_error"]["p90_abs_pct"] == spec["backward"]["p90_abs_pct"]
    assert "leave-one-GPU-out" in fwd["expected_error"]["basis"]
    assert "expected_error" not in out["phases"]["h2d"]
    bf16 = predict_step("h100", "bert-base", 8, "bf16", db=ProfileDB.from_rows(rows_from_records([])))
    layers = load_table()["paths"]["published-layers"]["step"]
    assert bf16["phases"]["forward"]["expected_error"]["median_abs_pct"] == layers["median_abs_pct"]


def test_a_measured_figure_has_no_model_error_and_an_interpolated_one_has() -> None:
    rows = rows_from_records([
        {"gpu": "t4", "workload": "resnet18", "phase": phase, "batch_size": b, "dtype": "fp32", "value": v,
         "unit": "s", "measured": 1, "source": "hand"}
        for phase in ("forward", "backward") for b, v in ((32, 0.1), (64, 0.2))])
    db = ProfileDB.from_rows(rows)
    measured = predict_step("t4", "resnet18", 32, db=db)["phases"]["forward"]
    assert measured["source"] == "measured" and "expected_error" not in measured
    between = predict_step("t4", "resnet18", 48, db=db)["phases"]["forward"]
    interp = load_table()["paths"]["profile-interpolation"]["forward"]
    assert between["source"] == "interpolated"
    assert between["expected_error"]["p90_abs_pct"] == interp["p90_abs_pct"]
    assert expected_error("profile-interpolation", "interpolated", "forward") is not None


def test_the_predict_table_shows_the_error_and_its_basis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpemu.profiles.db.builtin_profile_paths", lambda: [])
    monkeypatch.setenv("GPEMU_PROFILE_DIR", "/nonexistent-gpemu-profiles")
    ProfileDB.clear_cache()
    try:
        result = runner.invoke(app, ["predict", "-g", "l4", "-m", "resnet50", "-b", "32"])
        as_json = json.loads(runner.invoke(app, ["predict", "-g", "l4", "-m", "resnet50", "-b", "32", "--json"]).stdout)
    finally:
        ProfileDB.clear_cache()
    assert result.exit_code == 0, result.output
    err = as_json["phases"]["forward"]["expected_error"]
    assert f"~{err['median_abs_pct']:.0f}% (p90 {err['p90_abs_pct']:.0f}%)" in result.stdout
    assert "expected |error| = median (p90) absolute error" in result.stdout


def test_predict_shows_what_the_published_rows_say_about_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Published bias per GPU]: per model kind and GPU, written by bench/published_validation.py --write
    by_gpu = load_table()["published_by_gpu"]
    entry = by_gpu["vision"]["rtx4090"]
    assert entry["rows"] == 2  # Lambda's resnet50 TF32 and AMP rows
    bias = published_bias("rtx4090")
    assert bias is not None and bias.signed_median_pct == entry["signed_median_pct"]
    assert published_bias("rtx4090", "lm").rows == by_gpu["lm"]["rtx4090"]["rows"]  # type: ignore[union-attr]
    assert published_bias("k80") is None  # no published row
    monkeypatch.setattr("gpemu.profiles.db.builtin_profile_paths", lambda: [])
    monkeypatch.setenv("GPEMU_PROFILE_DIR", "/nonexistent-gpemu-profiles")
    ProfileDB.clear_cache()
    try:
        result = runner.invoke(app, ["predict", "-g", "rtx4090", "-m", "resnet50", "-b", "32", "--dtype", "amp"])
        as_json = json.loads(runner.invoke(app, ["predict", "-g", "rtx4090", "-m", "resnet50", "-b", "32", "--dtype",
                                                  "amp", "--json"]).stdout)
    finally:
        ProfileDB.clear_cache()
    assert result.exit_code == 0, result.output
    assert as_json["published_bias"]["signed_median_pct"] == entry["signed_median_pct"]
    lean = "faster" if entry["signed_median_pct"] > 0 else "slower"
    line = " ".join(result.stdout.split())  # rich wraps long lines
    assert (f"published real-GPU image-model throughputs on rtx4090: 2 rows, gpemu "
            f"{abs(entry['signed_median_pct']):.0f}% {lean} than published") in line


def test_language_model_training_shows_the_llm_pretraining_rows_of_its_gpu() -> None:
    # Note [Published bias per GPU]: a language model's training step on a GPU with MosaicML's MPT rows
    # (bench/llm_foundry_validation.py --write: 13 H100 rows at 512-4096 tokens without checkpointing) is compared
    # with those; a GPU without them (RTX 3090) falls back to the SQuAD / layer rows of kind "lm"; inference to "lm"
    from gpemu.profiles.step import predict_step

    entry = load_table()["published_by_gpu"]["lm-pretrain"]["h100-sxm5-80gb"]
    assert entry["rows"] == 13 and "MPT" in entry["basis"]
    h100 = predict_step("h100", "gpt2@1024", 8, "amp_bf16")["published_bias"]
    assert h100["model_kind"] == "lm-pretrain" and h100["signed_median_pct"] == entry["signed_median_pct"]
    assert predict_step("rtx3090", "gpt2@1024", 8, "amp_bf16")["published_bias"]["model_kind"] == "lm"
    assert predict_step("h100", "gpt2@1024", 8, "amp_bf16", mode="infer")["published_bias"]["model_kind"] == "lm"
    assert predict_step("h100", "resnet18", 8, "amp")["published_bias"]["model_kind"] == "vision"
