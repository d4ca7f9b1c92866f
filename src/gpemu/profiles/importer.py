"""Importer for GPEmu's on-disk profile tree (time/compute, time/transfer, memory) into native profile CSVs."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpemu.errors import GpemuError, ProfileFormatError, UnknownNameError
from gpemu.hardware import get_gpu
from gpemu.profiles.db import GpemuWarning, ProfileDB, user_profile_dir
from gpemu.profiles.detect import linear_fill_mask, quadratic_fill_mask
from gpemu.profiles.native import rows_from_records, stage_profile_csv

# GPEmu tree layout (relative to the profiles root), see docs/profiles.md:
#   time/compute/{forward,backward}/<GPU>/<model>/time_by_batch_size.csv   Batch_Size,Time_In_SECONDS
#   time/transfer/<GPU>/<model>/data_transfer_time_by_batch_size.csv        Batch_Size,Time_In_SECONDS (pageable)
#   time/transfer/<GPU>/<model>/model_transfer_time.txt                     one number, seconds
#   memory/<GPU>/<model>/memory.csv                                         batch_size,peak,persistent (MiB)
TIME_FILE = "time_by_batch_size.csv"
TRANSFER_FILE = "data_transfer_time_by_batch_size.csv"
MODEL_TRANSFER_FILE = "model_transfer_time.txt"
MEMORY_FILE = "memory.csv"
SOURCE_PREFIX = "gpemu-import:"

ProgressFn = Callable[[int, int], None]  # (files done, files total)


@dataclass
class ImportReport:
    """What an import read and wrote: row counts overall and per GPU, files written, GPU folders skipped."""

    rows: int = 0
    measured: int = 0
    filled: int = 0
    per_gpu: dict[str, dict[str, int]] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    skipped_gpus: list[str] = field(default_factory=list)
    dest_dir: Path | None = None


@dataclass(frozen=True)
class _Job:
    path: Path
    gpu_folder: str
    model: str
    kind: str  # "forward" | "backward" | "h2d" | "model_h2d" | "memory"


def find_gpemu_root(src_path: str | os.PathLike[str]) -> Path:
    """Return the folder holding GPEmu's time/ and memory/ (src_path itself or one level below)."""
    src = Path(src_path).expanduser()
    if not src.is_dir():
        raise GpemuError(f"GPEmu profile folder not found: {src}")
    candidates = [src, *sorted(p for p in src.iterdir() if p.is_dir())]
    for cand in candidates:
        if (cand / "time").is_dir() or (cand / "memory").is_dir():
            return cand
    raise GpemuError(f"{src} does not look like a GPEmu profiled_data tree (no time/ or memory/ folder inside)")


def _jobs(root: Path) -> list[_Job]:
    jobs: list[_Job] = []
    for phase in ("forward", "backward"):
        base = root / "time" / "compute" / phase
        jobs += [_Job(f, f.parent.parent.name, f.parent.name, phase) for f in sorted(base.glob(f"*/*/{TIME_FILE}"))]
    base = root / "time" / "transfer"
    jobs += [_Job(f, f.parent.parent.name, f.parent.name, "h2d") for f in sorted(base.glob(f"*/*/{TRANSFER_FILE}"))]
    jobs += [
        _Job(f, f.parent.parent.name, f.parent.name, "model_h2d")
        for f in sorted(base.glob(f"*/*/{MODEL_TRANSFER_FILE}"))
    ]
    base = root / "memory"
    jobs += [_Job(f, f.parent.parent.name, f.parent.name, "memory") for f in sorted(base.glob(f"*/*/{MEMORY_FILE}"))]
    return jobs


def _read_table(path: Path, n_values: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (batch sizes, values[n, n_values]) of a GPEmu CSV with a header; raise ProfileFormatError."""
    batches: list[int] = []
    values: list[list[float]] = []
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or len(header) != n_values + 1:
                raise ProfileFormatError(path, 1, f"expected a header with {n_values + 1} columns, got {header}")
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != n_values + 1:
                    raise ProfileFormatError(path, line, f"expected {n_values + 1} columns, got {len(row)}")
                try:
                    nums = [float(c) for c in row]
                except ValueError as exc:
                    raise ProfileFormatError(path, line, f"not a number: {exc}") from exc
                if not all(math.isfinite(x) for x in nums) or nums[0] < 1 or nums[0] != round(nums[0]):
                    raise ProfileFormatError(path, line, f"bad batch size or value in {row}")
                batches.append(round(nums[0]))
                values.append(nums[1:])
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(path, None, f"cannot read: {exc}") from exc
    order = np.argsort(batches, kind="stable")
    return np.asarray(batches, dtype=np.int64)[order], np.asarray(values, dtype=float).reshape(-1, n_values)[order]


def _read_scalar(path: Path) -> float:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(path, None, f"cannot read: {exc}") from exc
    try:
        value = float(text.split()[0])
    except (ValueError, IndexError) as exc:
        raise ProfileFormatError(path, 1, f"expected one number of seconds, got {text[:40]!r}") from exc
    if not math.isfinite(value) or value < 0:
        raise ProfileFormatError(path, 1, f"expected a finite number of seconds >= 0, got {value}")
    return value


def _records(job: _Job, gpu_key: str, root: Path) -> list[dict[str, object]]:
    source = SOURCE_PREFIX + job.path.relative_to(root).as_posix()
    base = {"gpu": gpu_key, "workload": job.model, "dtype": "fp32", "source": source}
    if job.kind == "model_h2d":
        return [{**base, "phase": "model_h2d", "batch_size": 0, "value": _read_scalar(job.path), "unit": "s", "measured": 1}]
    if job.kind == "memory":
        batch, vals = _read_table(job.path, 2)
        capacity_mib = get_gpu(gpu_key).memory_gib * 1024
        out: list[dict[str, object]] = []
        for col, phase in ((0, "mem_peak"), (1, "mem_persistent")):
            # Negative MiB, or more than the card holds, cannot have been measured: GPEmu's quadratic went there.
            impossible = (vals[:, col] < 0) | (vals[:, col] > capacity_mib)
            filled = quadratic_fill_mask(vals[:, col]) | impossible
            out += [
                {**base, "phase": phase, "batch_size": int(b), "value": float(v), "unit": "MiB", "measured": int(not f)}
                for b, v, f in zip(batch, vals[:, col], filled, strict=True)
            ]
        return out
    batch, vals = _read_table(job.path, 1)
    filled = linear_fill_mask(vals[:, 0]) | (vals[:, 0] < 0)
    phase = "h2d_pageable" if job.kind == "h2d" else job.kind
    return [
        {**base, "phase": phase, "batch_size": int(b), "value": float(v), "unit": "s", "measured": int(not f)}
        for b, v, f in zip(batch, vals[:, 0], filled, strict=True)
    ]


def read_gpemu_tree(
    src_path: str | os.PathLike[str], progress: ProgressFn | None = None
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Return ({gpu key: native rows}, skipped GPU folder names) parsed from a GPEmu tree, writing nothing."""
    root = find_gpemu_root(src_path)
    jobs = _jobs(root)
    if not jobs:
        raise GpemuError(f"no GPEmu profile files found under {root}")
    keys: dict[str, str | None] = {}
    for folder in sorted({j.gpu_folder for j in jobs}):
        try:
            keys[folder] = get_gpu(folder).key
        except UnknownNameError:
            keys[folder] = None
    skipped = sorted(f for f, k in keys.items() if k is None)
    if skipped:
        warnings.warn(
            f"skipping GPU folders gpemu does not know: {', '.join(skipped)} (see `gpemu gpus`)",
            GpemuWarning,
            stacklevel=2,
        )
    per_gpu: dict[str, list[dict[str, object]]] = {}
    for n, job in enumerate(jobs, 1):
        key = keys[job.gpu_folder]
        if key is not None:
            per_gpu.setdefault(key, []).extend(_records(job, key, root))
        if progress is not None:
            progress(n, len(jobs))
    return {k: rows_from_records(v) for k, v in sorted(per_gpu.items())}, skipped


def import_gpemu(
    src_path: str | os.PathLike[str],
    dest_dir: str | os.PathLike[str] | None = None,
    progress: ProgressFn | None = None,
) -> ImportReport:
    """Import a GPEmu tree into one native CSV per GPU in dest_dir (default: user profile dir); return the counts."""
    tables, skipped = read_gpemu_tree(src_path, progress)
    dest = Path(dest_dir).expanduser() if dest_dir is not None else user_profile_dir()
    report = ImportReport(skipped_gpus=skipped, dest_dir=dest)
    staged: list[tuple[Path, Path]] = []
    try:
        for key, rows in tables.items():  # stage every file first: nothing is replaced unless all were written
            target = dest / f"gpemu-{key}.csv"
            staged.append((stage_profile_csv(rows, target), target))
            measured = int(rows["measured"].sum())
            report.per_gpu[key] = {"rows": len(rows), "measured": measured, "filled": len(rows) - measured}
        for tmp, target in staged:
            os.replace(tmp, target)
            report.files.append(target)
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    report.rows = sum(c["rows"] for c in report.per_gpu.values())
    report.measured = sum(c["measured"] for c in report.per_gpu.values())
    report.filled = report.rows - report.measured
    ProfileDB.clear_cache()
    return report
