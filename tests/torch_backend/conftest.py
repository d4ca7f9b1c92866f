"""Fixtures: an installed emulation that is always uninstalled, and a profile lookup over ../shared/data."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpemu.torch_backend as gt


@pytest.fixture(autouse=True)
def _fp32_precision() -> Iterator[None]:
    """Restore torch's TF32 settings after every test: scripts run in-process (nanoGPT's idioms) set them, and they
    change how fp32 GEMMs and convolutions are priced (Note [FP32 math modes] in cost/roofline.py)."""
    import torch

    saved = (torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
             torch.backends.cudnn.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield
    (torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision,
     torch.backends.cudnn.conv.fp32_precision) = saved


@pytest.fixture(autouse=True)
def _deterministic_algorithms() -> Iterator[None]:
    """Restore torch.use_deterministic_algorithms after every test: torchvision's classification reference run
    in-process (`--use-deterministic-algorithms`) turned it on for every later test, and torchvision's roi_align then
    takes its pure-PyTorch path, whose (K, C, 28, 28, H, W) gather over 1,024 worst-case RoIs does not fit a V100
    (test_mask_rcnn_heads_run_on_the_sampled_rois failed after test_public_idioms.py, passed alone)."""
    import torch

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


@pytest.fixture
def emu() -> Iterator[gt.Emulation]:
    """Return an installed 1x V100 emulation; uninstall afterwards."""
    e = gt.install("v100")
    yield e
    gt.uninstall()


def gpemu_tree_lookup(root: Path, folder: str = "Tesla_V100-PCIE-32GB"):
    """Return a phase lookup over GPEmu's on-disk tree (measured rows only; fp32)."""

    def lookup(gpu: str, workload: str, phase: str, batch_size: int, dtype: str) -> float | None:
        f = root / "gpemu-profiles" / "time" / "compute" / phase / folder / workload / "time_by_batch_size.csv"
        if dtype != "fp32" or not f.exists():
            return None
        with f.open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if int(row["Batch_Size"]) == batch_size:
                    return float(row["Time_In_SECONDS"])
        return None

    return lookup


def gpemu_run_script(tmp_path: Path, script: str, *flags: str, timeout_s: int = 300) -> subprocess.CompletedProcess[str]:
    """Run `gpemu run --gpu a100 <flags> -- python tests/torch_backend/scripts/<script>` in `tmp_path`."""
    path = Path(__file__).resolve().parent / "scripts" / script
    return subprocess.run([sys.executable, "-m", "gpemu", "run", "--gpu", "a100", *flags, "--", "python", str(path)],
                          capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path)
