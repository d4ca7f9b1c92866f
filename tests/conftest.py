"""Shared fixtures: the path to ../shared/data (tests that need it skip cleanly when it is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPEMU_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Return ../shared/data, or skip the test when it is absent."""
    if not (SHARED_DATA / "gpemu-profiles").is_dir():
        pytest.skip(f"shared reference data not found at {SHARED_DATA}")
    return SHARED_DATA


# Checked once at collection, before any test installs the emulator (which patches torch.cuda.is_available).
REAL_CUDA = bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `gpu` on machines without a real CUDA GPU."""
    if REAL_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
