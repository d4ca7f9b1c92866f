"""Profiler output: the native profile CSV plus detail files, written incrementally and atomically.

Layout of an output directory (see docs/profiler.md):
  <gpu>.csv                    native profile rows, exactly gpemu.profiles.COLUMNS (loads into ProfileDB)
  details/spread-<gpu>.csv     run-to-run statistics per row (n, mean, std, min, p10, p50, p90, max)
  details/ops-<gpu>.csv        per-op kernel times from torch.profiler
  details/bandwidth-<gpu>.csv  copy time and GB/s by bytes, pinned and pageable, both directions
  details/limits-<gpu>.csv     out-of-memory markers: the first batch size that did not fit
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpemu.errors import ProfileFormatError
from gpemu.profiles.schema import COLUMNS

SPREAD_COLUMNS = ("gpu", "workload", "phase", "batch_size", "dtype", "unit", "n", "mean", "std", "min", "p10", "p50",
                  "p90", "max", "measured", "source")  # fmt: skip
OPS_COLUMNS = ("gpu", "workload", "batch_size", "dtype", "op", "input_shapes", "calls_per_step", "device_time_us",
               "self_device_time_us", "cpu_time_us", "measured", "source")  # fmt: skip
BANDWIDTH_COLUMNS = ("gpu", "direction", "memory", "size_bytes", "time_s", "p10_s", "p90_s", "bw_gbps", "measured",
                     "source")  # fmt: skip
LIMITS_COLUMNS = ("gpu", "workload", "dtype", "oom_batch_size", "max_fit_batch_size", "error", "source")

Row = dict[str, object]


def write_csv_atomic(path: Path, columns: Sequence[str], rows: Iterable[Row]) -> Path:
    """Write `rows` as CSV with header `columns` to a temp file beside `path`, then os.replace it; return path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="raise", lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({c: _fmt(row.get(c, "")) for c in columns})
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fmt(value: object) -> object:
    if isinstance(value, float):
        return repr(value)
    return value


def read_csv_rows(path: Path, columns: Sequence[str]) -> list[Row]:
    """Return the rows of a CSV whose header must equal `columns`; raise ProfileFormatError otherwise."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != tuple(columns):
            raise ProfileFormatError(path, 1, f"header must be {','.join(columns)}, got {reader.fieldnames}")
        return [dict(row) for row in reader]


def read_native_profile(path: Path) -> list[Row]:
    """Return typed rows (batch_size/measured int, value float) of a native profile CSV."""
    rows = read_csv_rows(path, COLUMNS)
    out: list[Row] = []
    for line, row in enumerate(rows, start=2):
        try:
            row["batch_size"] = int(str(row["batch_size"]))
            row["measured"] = int(str(row["measured"]))
            row["value"] = float(str(row["value"]))
        except ValueError as exc:
            raise ProfileFormatError(path, line, f"bad number: {exc}") from None
        out.append(row)
    return out


def row_key(row: Row) -> tuple[str, str, str, int, str]:
    """Return the identity of a profile row: (gpu, workload, phase, batch_size, dtype)."""
    return (str(row["gpu"]), str(row["workload"]), str(row["phase"]), int(str(row["batch_size"])), str(row["dtype"]))


class ProfileStore:
    """Accumulates one profiling run's rows and rewrites its files atomically after every configuration."""

    def __init__(self, out_dir: Path, gpu_key: str, resume: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.gpu_key = gpu_key
        self.profile_path = self.out_dir / f"{gpu_key}.csv"
        details = self.out_dir / "details"
        self.paths = {
            "spread": details / f"spread-{gpu_key}.csv",
            "ops": details / f"ops-{gpu_key}.csv",
            "bandwidth": details / f"bandwidth-{gpu_key}.csv",
            "limits": details / f"limits-{gpu_key}.csv",
        }
        self.columns = {"spread": SPREAD_COLUMNS, "ops": OPS_COLUMNS, "bandwidth": BANDWIDTH_COLUMNS,
                        "limits": LIMITS_COLUMNS}  # fmt: skip
        self.rows: dict[tuple[str, str, str, int, str], Row] = {}
        self.details: dict[str, list[Row]] = {name: [] for name in self.paths}
        if resume:
            self._load_existing()

    def _load_existing(self) -> None:
        if self.profile_path.exists():
            for row in read_native_profile(self.profile_path):
                self.rows[row_key(row)] = row
        for name, path in self.paths.items():
            if path.exists():
                self.details[name] = read_csv_rows(path, self.columns[name])

    def add_rows(self, rows: Iterable[Row]) -> None:
        """Add (or replace, same key) native profile rows."""
        for row in rows:
            self.rows[row_key(row)] = row

    def add_details(self, name: str, rows: Iterable[Row]) -> None:
        """Append rows to a detail table ("spread", "ops", "bandwidth", "limits")."""
        self.details[name].extend(rows)

    def has_config(self, workload: str, batch_size: int, dtype: str) -> bool:
        """Return True when a forward row for (workload, batch_size, dtype) is already stored."""
        return (self.gpu_key, workload, "forward", batch_size, dtype) in self.rows

    def oom_batch(self, workload: str, dtype: str) -> int | None:
        """Return the smallest batch size recorded as out-of-memory for (workload, dtype), or None."""
        hits = [int(str(r["oom_batch_size"])) for r in self.details["limits"]
                if r["workload"] == workload and r["dtype"] == dtype]  # fmt: skip
        return min(hits) if hits else None

    def has_bandwidth(self, size_bytes: int) -> bool:
        """Return True when copies of `size_bytes` were measured already."""
        return any(int(str(r["size_bytes"])) == size_bytes for r in self.details["bandwidth"])

    def flush(self) -> None:
        """Rewrite every file atomically from the rows held (called after each configuration)."""
        ordered = sorted(self.rows.values(), key=lambda r: (str(r["workload"]), str(r["dtype"]), str(r["phase"]),
                                                            int(str(r["batch_size"]))))  # fmt: skip
        write_csv_atomic(self.profile_path, COLUMNS, ordered)
        for name, path in self.paths.items():
            if self.details[name]:
                write_csv_atomic(path, self.columns[name], self.details[name])
