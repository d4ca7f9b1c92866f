"""Merging profile files into a profile directory: add new rows, newer measured rows replace older ones."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpemu.errors import GpemuError, ProfileFormatError
from gpemu.profiler.store import Row, read_native_profile, row_key, write_csv_atomic
from gpemu.profiles.schema import COLUMNS, DTYPES, PHASES

_DATE = re.compile(r"(?:^|;\s*)date=([^;]+)")


def default_profile_dir() -> Path:
    """Return the user profile directory ($GPEMU_PROFILE_DIR, else platformdirs' user data dir + /profiles)."""
    try:  # the profile DB's own notion wins when it provides one
        from gpemu import profiles

        for name in ("user_profile_dir", "default_profile_dir"):
            fn = getattr(profiles, name, None)
            if callable(fn):
                return Path(fn())
    except ImportError:  # pragma: no cover
        pass
    env = os.environ.get("GPEMU_PROFILE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("gpemu")) / "profiles"


def row_date(row: Row) -> str:
    """Return the ISO date in a row's source ("date=..."), or "" when it has none (treated as oldest)."""
    match = _DATE.search(str(row.get("source", "")))
    return match.group(1).strip() if match else ""


def native_files(path: Path) -> list[Path]:
    """Return `path` if it is a file, else the top-level *.csv files in it whose header is exactly COLUMNS."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise GpemuError(f"profile source {str(path)!r} does not exist")
    out = []
    for candidate in sorted(path.glob("*.csv")):
        with open(candidate, encoding="utf-8") as fh:
            if fh.readline().strip() == ",".join(COLUMNS):
                out.append(candidate)
    return out


def _checked(path: Path) -> list[Row]:
    rows = read_native_profile(path)
    for line, row in enumerate(rows, start=2):
        if row["phase"] not in PHASES:
            raise ProfileFormatError(path, line, f"unknown phase {row['phase']!r} (one of {', '.join(PHASES)})")
        if row["dtype"] not in DTYPES:
            raise ProfileFormatError(path, line, f"unknown dtype {row['dtype']!r} (one of {', '.join(DTYPES)})")
    return rows


def wins(new: Row, old: Row) -> bool:
    """Return True when `new` should replace `old`: measured beats filled; among equals, the newer date wins."""
    if int(str(new["measured"])) != int(str(old["measured"])):
        return int(str(new["measured"])) > int(str(old["measured"]))
    return row_date(new) >= row_date(old)


@dataclass
class MergeReport:
    """Counts of a merge and the files it wrote."""

    into: Path
    added: int = 0
    replaced: int = 0
    kept: int = 0  # the existing row was newer or measured where the new one was not
    unchanged: int = 0  # identical row already present
    written: list[Path] = field(default_factory=list)
    per_gpu: dict[str, int] = field(default_factory=dict)  # rows added or replaced, by gpu


def merge_profiles(sources: Sequence[Path | str], into: Path | str | None = None) -> MergeReport:
    """Merge native profile files/directories `sources` into `into` (default: the user profile dir), atomically."""
    into_dir = Path(into) if into is not None else default_profile_dir()
    report = MergeReport(into_dir)
    files: dict[Path, list[Row]] = {}
    where: dict[tuple[str, str, str, int, str], tuple[Path, int]] = {}
    if into_dir.is_dir():
        for path in native_files(into_dir):
            files[path] = _checked(path)
            for i, row in enumerate(files[path]):
                where[row_key(row)] = (path, i)
    src_files = [f for s in sources for f in native_files(Path(s))]
    if not src_files:
        raise GpemuError(f"no native profile CSV (header {','.join(COLUMNS)}) in {', '.join(map(str, sources))}")
    changed: set[Path] = set()
    for src in src_files:
        for row in _checked(src):
            key = row_key(row)
            if key in where:
                path, i = where[key]
                old = files[path][i]
                if all(str(old[c]) == str(row[c]) for c in COLUMNS):
                    report.unchanged += 1
                    continue
                if not wins(row, old):
                    report.kept += 1
                    continue
                files[path][i] = row
                report.replaced += 1
            else:
                path = into_dir / f"{row['gpu']}.csv"
                bucket = files.setdefault(path, [])
                bucket.append(row)
                where[key] = (path, len(bucket) - 1)
                report.added += 1
            changed.add(path)
            report.per_gpu[str(row["gpu"])] = report.per_gpu.get(str(row["gpu"]), 0) + 1
    for path in sorted(changed):
        report.written.append(write_csv_atomic(path, COLUMNS, files[path]))
    return report
