"""Validation: per-iteration error of an emulated run against a real-GPU run of the same script."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpemu.errors import GpemuError


def load_iterations(path: Path | str) -> list[float]:
    """Return per-iteration seconds from a run report: {"iterations": [{"wall_s": x}, ...]}, a list of such
    objects, or a plain list of numbers; raise GpemuError naming the file when it is malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GpemuError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GpemuError(f"{path}: not valid JSON ({exc})") from None
    items = data.get("iterations") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise GpemuError(f"{path}: expected a list of iterations or {{\"iterations\": [...]}}")
    out: list[float] = []
    for i, item in enumerate(items):
        value = item.get("wall_s") if isinstance(item, dict) else item
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise GpemuError(f"{path}: iteration {i} has no non-negative number 'wall_s' (got {item!r})")
        out.append(float(value))
    return out


@dataclass(frozen=True)
class Validation:
    """Per-iteration comparison of a real and an emulated run (errors in percent of the real time)."""

    n_real: int
    n_emulated: int
    n_compared: int
    warmup: int
    median_abs_error_pct: float
    p90_abs_error_pct: float
    max_abs_error_pct: float
    mean_real_s: float
    mean_emulated_s: float
    mean_error_pct: float  # signed: (mean emulated - mean real) / mean real
    errors_pct: tuple[float, ...]  # signed, per compared iteration

    def to_json(self) -> dict[str, object]:
        """Return a JSON-serialisable dict of the summary numbers."""
        out = dict(self.__dict__)
        out["errors_pct"] = list(self.errors_pct)
        return out


def compare_runs(real_s: list[float], emulated_s: list[float], warmup: int = 1) -> Validation:
    """Return the error of `emulated_s` against `real_s`, iteration by iteration, after dropping `warmup`."""
    if warmup < 0:
        raise GpemuError(f"--warmup must be >= 0, got {warmup}")
    real = np.asarray(real_s[warmup:], dtype=float)
    emu = np.asarray(emulated_s[warmup:], dtype=float)
    n = min(len(real), len(emu))
    if n == 0:
        raise GpemuError(
            f"nothing to compare after dropping {warmup} warm-up iteration(s): "
            f"real run has {len(real_s)}, emulated run has {len(emulated_s)}"
        )
    real, emu = real[:n], emu[:n]
    if np.any(real <= 0):
        raise GpemuError("the real run has an iteration of 0 s; per-iteration error is undefined")
    errors = (emu - real) / real * 100.0
    abs_err = np.abs(errors)
    mean_real, mean_emu = float(real.mean()), float(emu.mean())
    return Validation(
        n_real=len(real_s),
        n_emulated=len(emulated_s),
        n_compared=n,
        warmup=warmup,
        median_abs_error_pct=float(np.median(abs_err)),
        p90_abs_error_pct=float(np.percentile(abs_err, 90)),
        max_abs_error_pct=float(abs_err.max()),
        mean_real_s=mean_real,
        mean_emulated_s=mean_emu,
        mean_error_pct=(mean_emu - mean_real) / mean_real * 100.0,
        errors_pct=tuple(float(e) for e in errors),
    )
