"""Shared fixtures: the path to ../shared/data (tests that need it skip cleanly when it is absent)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def emu_a100() -> Iterator[Any]:
    """Return an installed 1x A100 drop-in emulation; uninstall afterwards."""
    import gpemu.torch_backend as gt

    e = gt.install("a100")
    yield e
    gt.uninstall()


@pytest.fixture
def gpemu_run_started(tmp_path: Path) -> Iterator[Callable[[list[str], str], tuple[subprocess.Popen[bytes], str]]]:
    """Return start(options, script): run `python -m gpemu run <options> -- python -c <script> <out>` and wait until
    the script wrote `<out>.pid`; returns (the gpemu run process, out). Leftover processes are killed afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    children: list[int] = []

    def start(options: list[str], script: str) -> tuple[subprocess.Popen[bytes], str]:
        out = str(tmp_path / f"child{len(procs)}")
        proc = subprocess.Popen([sys.executable, "-m", "gpemu", "run", *options, "--", sys.executable, "-c", script,
                                 out])
        procs.append(proc)
        deadline = time.monotonic() + 120
        while not os.path.exists(out + ".pid") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        children.append(int(Path(out + ".pid").read_text()))
        return proc, out

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


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
