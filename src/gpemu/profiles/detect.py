"""Detectors for rows a profiler filled in (a straight line or a quadratic) rather than measured."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# See Note [Detecting filled rows]
#
# GPEmu profiled every batch size 1..256 but could not run the ones that did not fit in memory; it filled those
# with a straight line (time) or a quadratic (memory) fitted to the measured ones. A real measurement is noisy: three
# consecutive timings are never collinear to 1e-9 relative, and four consecutive peak-memory readings are almost
# never on one quadratic to 1e-7 relative. So a run of consecutive batch sizes whose k-th differences vanish (k = 2
# for a line, 3 for a quadratic) was produced by a formula. Memory has one more tell: torch's caching allocator
# rounds every block to 512 bytes, so a measured memory_allocated figure in MiB times 2048 is an integer; such a row
# is kept as measured even when it happens to lie on the fitted quadratic.
# Validated against ROWS.csv in ../shared/data (tests/profiles/test_importer.py).

LINE_RTOL = 1e-9
QUAD_RTOL = 1e-7
BYTES_PER_ALLOC_BLOCK = 512  # torch CUDA caching allocator rounds every block up to 512 bytes


def _runs_on_polynomial(values: Sequence[float] | np.ndarray, order: int, rtol: float) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    filled = np.zeros(len(v), dtype=bool)
    window = order + 1
    if len(v) < window:
        return filled
    diff = np.abs(np.diff(v, order))
    scale = np.maximum(np.abs(v[: len(diff)]), np.abs(v[order:]))
    flat = diff <= rtol * np.maximum(scale, 1e-30)
    for i in np.flatnonzero(flat):
        filled[i : i + window] = True
    return filled


def linear_fill_mask(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Return a bool mask of points in runs of >= 3 consecutive exactly collinear values (a straight-line fill)."""
    return _runs_on_polynomial(values, 2, LINE_RTOL)


def quadratic_fill_mask(values_mib: Sequence[float] | np.ndarray) -> np.ndarray:
    """Return a bool mask of memory points on an exact quadratic run that are not whole 512-byte multiples."""
    v = np.asarray(values_mib, dtype=float)
    on_curve = _runs_on_polynomial(v, 3, QUAD_RTOL)
    blocks = v * (2**20 / BYTES_PER_ALLOC_BLOCK)  # MiB -> 512-byte blocks
    on_grid = np.isclose(blocks, np.round(blocks), rtol=0.0, atol=1e-6)
    return on_curve & ~on_grid
