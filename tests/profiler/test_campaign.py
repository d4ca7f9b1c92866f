"""Tests for gpemu.profiler.campaign and gpemu.profiler.provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpemu.profiler.campaign import campaign_passes, main, run_campaign
from gpemu.profiler.provenance import UnknownGPUWarning, collect, gpu_key_for
from gpemu.profiler.sweep import GPEMU_VISION_MODELS, LANGUAGE_MODELS


def test_campaign_covers_the_gpemu_set_in_priority_order() -> None:
    passes = campaign_passes()
    covered = {(m, d, b) for p in passes for m in p.models for d in p.dtypes for b in p.batch_sizes}
    for model in GPEMU_VISION_MODELS:
        for dtype in ("fp32", "amp"):
            assert {(model, dtype, 2**i) for i in range(10)} <= covered  # 1, 2, 4, ..., 512
    assert {m for m, _, _ in covered} == set(GPEMU_VISION_MODELS) | set(LANGUAGE_MODELS)
    assert passes[0].batch_sizes == (1, 16, 64, 256)  # a coarse grid of every model comes first
    assert all(b <= 256 for p in campaign_passes(max_batch=256) for b in p.batch_sizes)


def test_dry_campaign_runs_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = run_campaign(tmp_path, warmup=0, reps=2, dry_run=True, show_progress=False)
    assert [p.name for p, _ in results] == ["coarse-fp32", "coarse-amp", "fill"]
    assert sum(len(s.done) for _, s in results) == 4 + 2 + 2  # 2 models x 2 batches, 1 x 2, 2 x 1
    assert all(s.failed == [] for _, s in results)
    assert main(["--out", str(tmp_path), "--dry-run", "--reps", "1", "--warmup", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "coarse-fp32: done 0, resumed 4" in out and "campaign complete" in out


def test_gpu_key_and_provenance() -> None:
    assert gpu_key_for("Tesla V100-PCIE-32GB") == "v100-pcie-32gb"
    with pytest.warns(UnknownGPUWarning, match="nvidia-foo-9000"):
        assert gpu_key_for("NVIDIA Foo 9000") == "nvidia-foo-9000"
    prov = collect(dry_run=True)
    assert prov.gpu_key == "dry-run-cpu"
    source = prov.source(reps=20)
    assert source.startswith("gpemu-profile v0.1.0 dry-run; gpu=cpu ")
    for field in ("driver=", "cuda=", "torch=", "cpu=", "date=", "reps=20"):
        assert field in source
