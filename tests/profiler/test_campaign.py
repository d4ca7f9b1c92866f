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


def test_lease_plan_puts_the_core_first_and_covers_the_rest() -> None:
    # Note [Lease plan]: a short GPU lease measures the core (18 models, fp32 + amp, batch 16/64/256, ops at 64),
    # then the language models, then batch 1, then the rest of the GPEmu set.
    passes = campaign_passes(plan="lease")
    assert [p.name for p in passes[:4]] == ["core", "lm", "host-floor", "rest"]
    assert passes[0].batch_sizes == (16, 64, 256) and passes[0].op_batch_sizes == (64,)
    assert len(passes[0].models) == 18 and {"vit_b_16", "convnext_tiny", "resnet50"} <= set(passes[0].models)
    covered = {m for p in passes for m in p.models}
    assert set(GPEMU_VISION_MODELS) | set(LANGUAGE_MODELS) <= covered
    with pytest.raises(KeyError, match="lease"):
        campaign_passes(plan="leese")


def test_profiling_an_emulated_gpu_is_not_a_measurement(tmp_path: Path) -> None:
    # Note [Profiling an emulated GPU]: rows written under gpemu's emulation are predictions, measured=0.
    import gpemu.torch_backend as gt
    from gpemu.profiler.runner import ProfileConfig, Profiler
    from gpemu.profiles.native import read_profile_csv

    gt.install("h200")
    try:
        prov = collect()
        assert prov.emulated and prov.measured == 0 and "emulated" in prov.source()
        config = ProfileConfig(models=["tiny-mlp"], batch_sizes=[2], dtypes=["fp32"], out_dir=tmp_path, warmup=0,
                               reps=1, ops=False, transfers=False)  # fmt: skip
        Profiler(config).run(show_progress=False)
    finally:
        gt.uninstall()
    rows = read_profile_csv(tmp_path / "h200-sxm-141gb.csv")
    assert len(rows) > 0 and (rows["measured"] == 0).all()
    assert rows["source"].str.contains("emulated").all()
