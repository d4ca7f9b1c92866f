"""Shared fixtures: the path to ../shared/data (tests that need it skip cleanly when it is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPEMU_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Return ../shared/data, or skip the test when it is absent."""
    if not (SHARED_DATA / "gpemu-profiles").is_dir():
        pytest.skip(f"shared reference data not found at {SHARED_DATA}")
    return SHARED_DATA
