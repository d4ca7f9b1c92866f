"""Tests for gpemu.profiler.sweep: batch-size, name and dtype list parsing."""

from __future__ import annotations

import pytest

from gpemu.errors import GpemuError, UnknownNameError
from gpemu.profiler.sweep import GPEMU_VISION_MODELS, parse_batch_sizes, parse_dtypes, parse_names

CASES = [
    ("single", "8", [8]),
    ("list, unsorted with duplicates", "4,1,4,2", [1, 2, 4]),
    ("inclusive range", "3-6", [3, 4, 5, 6]),
    ("powers of two", "pow2:1-256", [1, 2, 4, 8, 16, 32, 64, 128, 256]),
    ("powers of two inside a range", "pow2:3-40", [4, 8, 16, 32]),
    ("mixed", "1-3, pow2:8-16, 100", [1, 2, 3, 8, 16, 100]),
]


@pytest.mark.parametrize(("description", "spec", "expected"), CASES, ids=[c[0] for c in CASES])
def test_parse_batch_sizes(description: str, spec: str, expected: list[int]) -> None:
    assert parse_batch_sizes(spec) == expected


def test_full_range_has_every_batch() -> None:
    # "1-256" means every integer 1..256, as GPEmu measured
    assert len(parse_batch_sizes("1-256")) == 256


@pytest.mark.parametrize("spec", ["0", "8-4", "x", "pow2:", "1-", ""])
def test_bad_batch_specs_name_the_spec(spec: str) -> None:
    with pytest.raises(GpemuError, match="batch-size spec"):
        parse_batch_sizes(spec)


def test_parse_names_and_dtypes() -> None:
    assert parse_names(" resnet18, resnet50,resnet18 ") == ["resnet18", "resnet50"]
    assert parse_dtypes("FP32,amp") == ["fp32", "amp"]
    with pytest.raises(UnknownNameError, match="fp32"):
        parse_dtypes("fp33")


def test_gpemu_set_is_36_distinct_torchvision_models() -> None:
    import torchvision

    known = set(torchvision.models.list_models(module=torchvision.models))
    assert len(set(GPEMU_VISION_MODELS)) == 36
    assert set(GPEMU_VISION_MODELS) <= known
