"""Tests for gpemu.profiler.merge: add, replace-if-newer, measured beats filled, atomic output."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpemu.errors import GpemuError, ProfileFormatError
from gpemu.profiler.merge import default_profile_dir, merge_profiles, row_date
from gpemu.profiler.store import read_native_profile, write_csv_atomic
from gpemu.profiles.schema import COLUMNS


def _row(batch: int, value: float, measured: int = 1, date: str = "2025-01-01T00:00:00Z") -> dict[str, object]:
    return {"gpu": "v100-pcie-32gb", "workload": "resnet50", "phase": "forward", "batch_size": batch,
            "dtype": "fp32", "value": value, "unit": "s", "measured": measured,
            "source": f"gpemu-profile v0.1.0; gpu=x; date={date}" if date else "gpemu-import:x.csv"}  # fmt: skip


def test_merge_counts_and_rules(tmp_path: Path) -> None:
    into = tmp_path / "db"
    write_csv_atomic(into / "v100-pcie-32gb.csv", COLUMNS, [
        _row(1, 0.010, date=""),                        # old import, no date: replaced by a dated measurement
        _row(2, 0.020, date="2026-01-01T00:00:00Z"),    # newer than the incoming row: kept
        _row(4, 0.040, measured=1),                     # incoming row is filled (measured=0): kept
        _row(8, 0.080),                                 # identical incoming row: unchanged
    ])  # fmt: skip
    src = write_csv_atomic(tmp_path / "new" / "v100-pcie-32gb.csv", COLUMNS, [
        _row(1, 0.011, date="2025-06-01T00:00:00Z"),
        _row(2, 0.021, date="2025-06-01T00:00:00Z"),
        _row(4, 0.041, measured=0, date="2027-01-01T00:00:00Z"),
        _row(8, 0.080),
        _row(16, 0.160),                                # new key: added
    ])  # fmt: skip
    report = merge_profiles([src.parent], into)
    assert (report.added, report.replaced, report.kept, report.unchanged) == (1, 1, 2, 1)
    assert report.per_gpu == {"v100-pcie-32gb": 2}
    merged = {r["batch_size"]: r["value"] for r in read_native_profile(into / "v100-pcie-32gb.csv")}
    assert merged == {1: 0.011, 2: 0.020, 4: 0.040, 8: 0.080, 16: 0.160}
    assert not list(into.glob(".*tmp"))  # the atomic writer left no temp files


def test_merge_skips_detail_files_and_rejects_bad_rows(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_csv_atomic(src / "v100.csv", COLUMNS, [_row(1, 0.01)])
    write_csv_atomic(src / "notes.csv", ("a", "b"), [{"a": 1, "b": 2}])  # not a native profile: ignored
    assert merge_profiles([src], tmp_path / "db").added == 1
    bad = write_csv_atomic(tmp_path / "bad" / "x.csv", COLUMNS, [_row(1, 0.01) | {"phase": "fwd"}])
    with pytest.raises(ProfileFormatError, match=r"x\.csv:2: unknown phase 'fwd'"):
        merge_profiles([bad], tmp_path / "db")
    (tmp_path / "none").mkdir()
    with pytest.raises(GpemuError, match="no native profile CSV"):
        merge_profiles([tmp_path / "none"], tmp_path / "db")


def test_default_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path / "user"))
    assert default_profile_dir() == tmp_path / "user"
    assert row_date({"source": "a; date=2025-02-03T04:05:06Z; reps=20"}) == "2025-02-03T04:05:06Z"
