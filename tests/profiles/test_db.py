"""Tests for ProfileDB: layering, measured/interpolated/extrapolated/missing lookup, warnings, bad names."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from gpemu.errors import ProfileFormatError, UnknownNameError
from gpemu.profiles import GpemuWarning, ProfileDB, rows_from_records, write_profile_csv


def _row(batch: int, value: float, measured: int = 1, phase: str = "forward", gpu: str = "v100-pcie-32gb",
         workload: str = "toy", source: str = "hand") -> dict[str, object]:  # fmt: skip
    return {"gpu": gpu, "workload": workload, "phase": phase, "batch_size": batch, "dtype": "fp32",
            "value": value, "unit": "s", "measured": measured, "source": source}  # fmt: skip


@pytest.fixture
def gappy() -> ProfileDB:
    """Forward measured at batch 8, 16, 32 (gaps between), plus a filled row at 64 that must not count."""
    return ProfileDB.from_rows(
        rows_from_records([_row(8, 0.10), _row(16, 0.18), _row(32, 0.34), _row(64, 9.99, measured=0)])
    )


def test_exact_measured_row(gappy: ProfileDB) -> None:
    est = gappy.lookup("v100", "toy", "forward", 16)  # any alias resolves to the key
    assert (est.kind, est.value, est.unit, est.source) == ("measured", 0.18, "s", "hand")


def test_interpolated_between_nearest_measured(gappy: ProfileDB) -> None:
    est = gappy.lookup("Tesla V100-PCIE-32GB", "toy", "forward", 20)
    # 0.18 + (0.34 - 0.18) * (20 - 16) / (32 - 16) = 0.22
    assert est.kind == "interpolated"
    assert est.value == pytest.approx(0.22)
    assert est.details["neighbours"] == [(16, 0.18), (32, 0.34)]


def test_filled_row_is_never_measured_and_extrapolation_warns_once(gappy: ProfileDB) -> None:
    with pytest.warns(GpemuWarning, match="outside the measured range 8..32"):
        est = gappy.lookup("v100", "toy", "forward", 64)
    # least squares through (8, .10), (16, .18), (32, .34) is exact: slope 0.01, intercept 0.02 -> 0.66 at 64
    assert est.kind == "extrapolated"
    assert est.value == pytest.approx(0.66)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = gappy.lookup("v100", "toy", "forward", 128)  # same key: no second warning
        below = gappy.lookup("v100", "toy", "forward", 4, "fp32")  # below the range, same key: still silent
    assert again.value == pytest.approx(1.30)  # 0.01 * 128 + 0.02
    assert below.kind == "extrapolated"
    assert below.value == pytest.approx(0.06)  # 0.01 * 4 + 0.02


def test_missing_and_listing(gappy: ProfileDB) -> None:
    est = gappy.lookup("v100", "toy", "backward", 8)
    assert est.kind == "missing" and not est.ok and est.unit == "s"
    assert gappy.lookup("a100", "toy", "mem_peak", 8).unit == "MiB"
    assert gappy.gpus() == ["v100-pcie-32gb"]
    assert gappy.workloads() == ["toy"] and gappy.workloads("a100") == []
    assert gappy.has("v100", "toy") and not gappy.has("v100", "other")
    assert gappy.batch_sizes("v100", "toy", "forward") == [8, 16, 32]
    assert gappy.batch_sizes("v100", "toy", "forward", measured_only=False) == [8, 16, 32, 64]


def test_bad_names_raise_with_suggestions(gappy: ProfileDB) -> None:
    with pytest.raises(UnknownNameError, match="did you mean forward"):
        gappy.lookup("v100", "toy", "forwards", 8)
    with pytest.raises(UnknownNameError, match="fp16"):
        gappy.lookup("v100", "toy", "forward", 8, dtype="fp61")
    with pytest.raises(UnknownNameError, match="gpu"):
        gappy.lookup("v1OO-pcie", "toy", "forward", 8)


def test_only_filled_rows_are_extrapolated_not_measured() -> None:
    db = ProfileDB.from_rows(rows_from_records([_row(8, 0.1, measured=0), _row(16, 0.2, measured=0)]))
    with pytest.warns(GpemuWarning, match="only unmeasured"):
        est = db.lookup("v100", "toy", "forward", 8)
    assert est.kind == "extrapolated"
    assert est.value == pytest.approx(0.1)


def test_default_layers_user_dir_over_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builtin = tmp_path / "builtin.csv"
    write_profile_csv(rows_from_records([_row(8, 0.10, source="builtin"), _row(16, 0.2, source="builtin")]), builtin)
    user = tmp_path / "user"
    write_profile_csv(rows_from_records([_row(8, 0.12, source="mine")]), user / "mine.csv")
    monkeypatch.setattr("gpemu.profiles.db.builtin_profile_paths", lambda: [builtin])
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(user))
    db = ProfileDB.reload()
    assert db.lookup("v100", "toy", "forward", 8).source == "mine"  # user row wins on the same key
    assert db.lookup("v100", "toy", "forward", 16).source == "builtin"  # others stay
    assert ProfileDB.default() is db  # cached while the files are unchanged
    write_profile_csv(rows_from_records([_row(8, 0.13, source="newer")]), user / "mine.csv")
    ProfileDB.clear_cache()
    assert ProfileDB.default().lookup("v100", "toy", "forward", 8).value == 0.13
    ProfileDB.clear_cache()


def test_gpu_aliases_in_files_are_canonicalised(tmp_path: Path) -> None:
    write_profile_csv(rows_from_records([_row(8, 0.1, gpu="Tesla_V100-PCIE-32GB")]), tmp_path / "a.csv")
    db = ProfileDB.from_paths([tmp_path])
    assert db.gpus() == ["v100-pcie-32gb"]
    assert db.lookup("v100", "toy", "forward", 8).kind == "measured"


def test_malformed_file_in_a_directory_names_it(tmp_path: Path) -> None:
    (tmp_path / "broken.csv").write_text("gpu,workload\n")
    with pytest.raises(ProfileFormatError, match=r"broken\.csv:1"):
        ProfileDB.from_paths([tmp_path])


def test_batch_independent_row_holds_for_any_batch() -> None:
    db = ProfileDB.from_rows(rows_from_records([_row(0, 0.032, phase="model_h2d")]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = db.lookup("v100", "toy", "model_h2d", 128)
    assert (est.kind, est.value) == ("measured", 0.032)


def test_lookup_without_warning(gappy: ProfileDB) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = gappy.lookup("v100", "toy", "forward", 64, warn=False)
    assert est.kind == "extrapolated"
    with pytest.warns(GpemuWarning):  # the silent probe did not use up the once-per-key warning
        gappy.lookup("v100", "toy", "forward", 64)


def test_builtin_h200_profile_is_measured_and_can_be_held_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # The H200 profile measured on 2026-11-27 (bench/data/h200-2026-11-27) ships in the package: resnet50's fp32
    # forward at batch 256 took 39.2 ms there (median of 12 timed steps).
    from gpemu.hardware import get_gpu
    from gpemu.profiles.db import builtin_profile_paths

    assert any(p.name == "h200-sxm-141gb.csv" for p in builtin_profile_paths())
    db = ProfileDB.from_paths(builtin_profile_paths())
    est = db.lookup(get_gpu("h200"), "resnet50", "forward", 256, "fp32")
    assert est.kind == "measured" and est.value == pytest.approx(0.0392, rel=0.01)
    assert "NVIDIA H200" in est.source and "2026-11-27" in est.source
    monkeypatch.setenv("GPEMU_BUILTIN_PROFILES", "0")  # held-out checks: the cost model alone
    assert builtin_profile_paths() == []
