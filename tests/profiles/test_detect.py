"""Tests for the detectors of rows a profiler filled with a line (time) or a quadratic (memory)."""

from __future__ import annotations

import numpy as np

from gpemu.profiles.detect import linear_fill_mask, quadratic_fill_mask


def test_straight_tail_after_noisy_measurements_is_flagged() -> None:
    rng = np.random.default_rng(0)
    measured = 0.01 * np.arange(1, 11) * (1 + 0.05 * rng.standard_normal(10))  # 10 noisy timings
    tail = 0.2 + 0.0123 * np.arange(1, 7)  # 6 points on a line
    mask = linear_fill_mask(np.r_[measured, tail])
    assert mask.tolist() == [False] * 10 + [True] * 6


def test_short_interior_fill_is_flagged_and_two_points_are_not() -> None:
    v = np.array([1.0, 2.3, 2.9, 4.0, 5.0, 6.0, 7.4, 7.9])  # 4.0, 5.0, 6.0 collinear (second difference 0)
    assert np.flatnonzero(linear_fill_mask(v)).tolist() == [3, 4, 5]
    assert linear_fill_mask([1.0, 2.0]).tolist() == [False, False]  # two points: nothing to say


def test_quadratic_fill_but_not_whole_512_byte_readings() -> None:
    b = np.arange(1, 10, dtype=float)
    quad = 300.0 + 80.0 * b + b**2 / 3  # one quadratic; MiB * 2048 is whole only where 3 divides b
    # memory_allocated counts 512-byte blocks, so b = 3, 6, 9 could be real readings that lie on the fit
    assert np.flatnonzero(~quadratic_fill_mask(quad)).tolist() == [2, 5, 8]
    noisy = quad * (1 + 0.01 * np.sin(np.arange(9) * 1.7))
    assert not quadratic_fill_mask(noisy).any()
