"""Tests for the native profile CSV: exact header, strict validation naming file and line, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpemu.errors import ProfileFormatError
from gpemu.profiles import COLUMNS, read_profile_csv, rows_from_records, write_profile_csv

HEADER = ",".join(COLUMNS)


def _rows():
    return rows_from_records(
        [
            {"gpu": "v100-pcie-32gb", "workload": "toy", "phase": "forward", "batch_size": 8, "dtype": "fp32",
             "value": 0.5, "unit": "s", "measured": 1, "source": "hand, a test"},
            {"gpu": "v100-pcie-32gb", "workload": "toy", "phase": "forward", "batch_size": 4, "dtype": "fp32",
             "value": 0.25, "unit": "s", "measured": 0},
        ]
    )  # fmt: skip


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = write_profile_csv(_rows(), tmp_path / "p.csv")
    text = path.read_text().splitlines()
    assert text[0] == HEADER
    back = read_profile_csv(path)
    assert list(back.columns) == list(COLUMNS)
    # rows are written sorted by key: batch 4 before batch 8
    assert back["batch_size"].tolist() == [4, 8]
    assert back["value"].tolist() == [0.25, 0.5]
    assert back["measured"].tolist() == [0, 1]
    assert back["source"].tolist() == ["", "hand, a test"]  # a comma inside a field survives quoting
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]  # no temp file left behind
    assert oct(path.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    ("description", "line2", "problem"),
    [
        ("unknown phase", "v100,toy,forwrd,1,fp32,0.1,s,1,x", "phase 'forwrd'"),
        ("unknown dtype", "v100,toy,forward,1,fp31,0.1,s,1,x", "dtype 'fp31'"),
        ("fractional batch", "v100,toy,forward,1.5,fp32,0.1,s,1,x", "batch_size '1.5'"),
        ("negative batch", "v100,toy,forward,-1,fp32,0.1,s,1,x", "batch_size '-1'"),
        ("text value", "v100,toy,forward,1,fp32,fast,s,1,x", "value 'fast'"),
        ("infinite value", "v100,toy,forward,1,fp32,inf,s,1,x", "value 'inf'"),
        ("measured flag 2", "v100,toy,forward,1,fp32,0.1,s,2,x", "measured '2'"),
        ("negative measured value", "v100,toy,forward,1,fp32,-0.1,s,1,x", "negative"),
        ("empty workload", "v100,,forward,1,fp32,0.1,s,1,x", "empty 'workload'"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, description: str, line2: str, problem: str) -> None:
    path = tmp_path / "bad.csv"
    good = "v100,toy,forward,2,fp32,0.2,s,1,x"
    path.write_text(f"{HEADER}\n{good}\n{good.replace(',2,', ',3,')}\n{line2}\n")
    with pytest.raises(ProfileFormatError) as info:
        read_profile_csv(path)
    # header is line 1, two good rows, so the bad one is line 4
    assert str(info.value).startswith(f"{path}:4: "), description
    assert problem in str(info.value), description


def test_wrong_header_is_line_1(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("gpu,model,phase\nv100,toy,forward\n")
    with pytest.raises(ProfileFormatError, match=r"bad\.csv:1: header must be exactly"):
        read_profile_csv(path)


def test_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_profile_csv(_rows(), tmp_path / "p.csv")
    before = path.read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_profile_csv(_rows().iloc[:1], path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]
