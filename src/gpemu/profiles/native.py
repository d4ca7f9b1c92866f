"""The native profile file format: CSV with exactly COLUMNS as header; strict reading and atomic writing."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from gpemu.errors import ProfileFormatError
from gpemu.profiles.schema import COLUMNS, DTYPES, PHASES

# Identify a row: two rows with the same key describe the same figure (the later one wins when layering).
KEY_COLUMNS: tuple[str, ...] = ("gpu", "workload", "phase", "batch_size", "dtype")


def empty_rows() -> pd.DataFrame:
    """Return an empty profile table with the native columns and dtypes."""
    return _typed(pd.DataFrame({c: [] for c in COLUMNS}))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    out = df.loc[:, list(COLUMNS)].copy()
    for col in ("gpu", "workload", "phase", "dtype", "unit", "source"):
        out[col] = out[col].astype(object).where(out[col].notna(), "").astype(str)
    out["batch_size"] = out["batch_size"].astype("int64")
    out["value"] = out["value"].astype("float64")
    out["measured"] = out["measured"].astype("int64")
    return out.reset_index(drop=True)


def rows_from_records(records: Iterable[Mapping[str, object]]) -> pd.DataFrame:
    """Return a validated profile table built from dicts keyed by COLUMNS (missing source -> "")."""
    recs = [dict(r) for r in records]
    if not recs:
        return empty_rows()
    for r in recs:
        r.setdefault("source", "")
        r.setdefault("measured", 1)
    df = pd.DataFrame.from_records(recs, columns=list(COLUMNS))
    validate_rows(df, "<records>", first_line=1)
    return _typed(df)


def validate_rows(df: pd.DataFrame, path: object, first_line: int = 2) -> None:
    """Raise ProfileFormatError naming `path` and the first bad line (data row i is line i + first_line)."""

    def fail(i: int, problem: str) -> None:
        raise ProfileFormatError(path, i + first_line, problem)

    for col in ("gpu", "workload", "unit"):
        bad = df[col].isna() | (df[col].astype(str).str.strip() == "")
        if bad.any():
            fail(int(bad.to_numpy().argmax()), f"empty {col!r}")
    for col, allowed in (("phase", PHASES), ("dtype", DTYPES)):
        bad = ~df[col].astype(str).isin(allowed)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            fail(i, f"{col} {df[col].iloc[i]!r} is not one of {', '.join(allowed)}")
    batch = pd.to_numeric(df["batch_size"], errors="coerce")
    bad = batch.isna() | (batch < 0) | (batch != batch.round())
    if bad.any():
        i = int(bad.to_numpy().argmax())
        fail(i, f"batch_size {df['batch_size'].iloc[i]!r} is not an integer >= 0")
    value = pd.to_numeric(df["value"], errors="coerce")
    bad = value.isna() | ~np.isfinite(value.fillna(0.0))
    if bad.any():
        i = int(bad.to_numpy().argmax())
        fail(i, f"value {df['value'].iloc[i]!r} is not a finite number")
    measured = pd.to_numeric(df["measured"], errors="coerce")
    bad = ~measured.isin([0, 1])
    if bad.any():
        i = int(bad.to_numpy().argmax())
        fail(i, f"measured {df['measured'].iloc[i]!r} is not 0 or 1")
    bad = (measured == 1) & (value < 0)  # a filled (measured=0) row may be any finite number, as its producer wrote it
    if bad.any():
        i = int(bad.to_numpy().argmax())
        fail(i, f"measured value {df['value'].iloc[i]!r} is negative")


def read_profile_csv(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Return the validated rows of one native profile CSV; raise ProfileFormatError naming file and line."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            header = fh.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(path, None, f"cannot read: {exc}") from exc
    got = tuple(h.strip() for h in header.split(","))
    if got != COLUMNS:
        raise ProfileFormatError(path, 1, f"header must be exactly {','.join(COLUMNS)} (got {header!r})")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], skip_blank_lines=True)
    except (pd.errors.ParserError, ValueError) as exc:
        raise ProfileFormatError(path, _parser_line(str(exc)), f"not valid CSV: {exc}") from exc
    if df.empty:
        return empty_rows()
    source = df["source"]
    df = df.replace("", pd.NA)
    df["source"] = source
    validate_rows(df, path)
    return _typed(df)


def _parser_line(message: str) -> int | None:
    m = re.search(r"line (\d+)", message)
    return int(m.group(1)) if m else None


def write_profile_csv(rows: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write rows as a native CSV atomically (temp file + os.replace) and return the path."""
    path = Path(path)
    tmp = stage_profile_csv(rows, path)
    os.replace(tmp, path)
    return path


def stage_profile_csv(rows: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write rows to a temporary file beside `path` and return it (os.replace it onto `path` to commit)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    validate_rows(rows, "<rows to write>", first_line=1)
    table = _typed(rows).sort_values(list(KEY_COLUMNS), kind="stable")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            table.to_csv(fh, index=False, float_format="%.17g", lineterminator="\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(name, 0o644)  # mkstemp creates 0600; a profile is an ordinary readable file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return Path(name)
