"""Tests for gpemu.profiler.runner: a dry run end to end, its output schema, resume, OOM, and use by the emulator."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpemu.device import EmulatedGPU, ManualClock
from gpemu.profiler.runner import ProfileConfig, Profiler, RunSummary
from gpemu.profiler.store import read_native_profile
from gpemu.profiles.schema import COLUMNS, DTYPES, PHASES

BATCHES = [1, 2]
DTYPES_RUN = ["fp32", "amp"]


def _config(out: Path, **kw: object) -> ProfileConfig:
    base: dict[str, object] = dict(models=["tiny-cnn"], batch_sizes=BATCHES, dtypes=DTYPES_RUN, out_dir=out,
                                   warmup=1, reps=3, dry_run=True, op_batch_sizes={2},
                                   bandwidth_sizes_bytes=(4096, 65536), gpu_name="v100")  # fmt: skip
    base.update(kw)
    return ProfileConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunSummary]:
    out = tmp_path_factory.mktemp("profile")
    return out, Profiler(_config(out)).run(show_progress=False)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_dry_run_writes_native_rows(dry_run: tuple[Path, RunSummary]) -> None:
    _, summary = dry_run
    assert summary.gpu_key == "v100-pcie-32gb"  # --gpu-name resolved through the catalog
    assert summary.done == [("tiny-cnn", d, b) for d in DTYPES_RUN for b in BATCHES]
    assert summary.failed == [] and summary.oom == []
    with open(summary.profile_path) as fh:
        assert fh.readline().strip() == ",".join(COLUMNS)  # exactly the native header
    rows = read_native_profile(summary.profile_path)
    # per (dtype, batch): 4 copies + 4 step phases + 3 memory = 11; plus one model_h2d row per dtype
    assert len(rows) == 2 * 2 * 11 + 2
    assert {r["phase"] for r in rows} == set(PHASES)
    assert {r["dtype"] for r in rows} <= set(DTYPES)
    assert all(r["measured"] == 0 and "dry-run" in str(r["source"]) for r in rows)
    assert all("torch=" in str(r["source"]) and "date=" in str(r["source"]) for r in rows)
    assert all(float(str(r["value"])) > 0 for r in rows)


def test_spread_p50_is_the_row_value(dry_run: tuple[Path, RunSummary]) -> None:
    out, summary = dry_run
    values = {(r["phase"], r["batch_size"], r["dtype"]): r["value"] for r in read_native_profile(summary.profile_path)}
    spread = _csv(out / "details" / "spread-v100-pcie-32gb.csv")
    assert len(spread) == 2 * 2 * 8  # 4 copies + 4 step phases per (dtype, batch)
    for s in spread:
        assert float(s["p10"]) <= float(s["p50"]) <= float(s["p90"])
        assert int(s["n"]) == 3
        assert values[(s["phase"], int(s["batch_size"]), s["dtype"])] == pytest.approx(float(s["p50"]))


def test_ops_and_bandwidth_details(dry_run: tuple[Path, RunSummary]) -> None:
    out, _ = dry_run
    ops = _csv(out / "details" / "ops-v100-pcie-32gb.csv")
    assert {o["batch_size"] for o in ops} == {"2"}  # only the requested op batch size
    convs = [o for o in ops if o["op"] == "aten::convolution" and o["dtype"] == "fp32"]
    assert convs and convs[0]["input_shapes"].startswith("[[2, 3, 224, 224]")
    assert float(convs[0]["calls_per_step"]) == 1.0
    bw = _csv(out / "details" / "bandwidth-v100-pcie-32gb.csv")
    # 2 curve sizes + the input batches 1 and 2 (3*224*224*4 = 602112 B per image), 4 copy kinds each
    assert sorted({int(r["size_bytes"]) for r in bw}) == [4096, 65536, 602112, 1204224]
    assert len(bw) == 4 * 4


def test_resume_skips_done_configurations(dry_run: tuple[Path, RunSummary]) -> None:
    out, first = dry_run
    before = first.profile_path.read_text()
    again = Profiler(_config(out)).run(show_progress=False)
    assert again.done == [] and len(again.resumed) == 4
    assert first.profile_path.read_text() == before


def test_oom_records_the_limit_and_moves_on(tmp_path: Path) -> None:
    # tiny-cnn: 1.479 MiB resident + 0.292 MiB activations per sample (fp32): batch 1 fits 1.9 MiB, batch 2 does not
    cfg = _config(tmp_path, batch_sizes=[1, 2, 4], dtypes=["fp32"], memory_limit_mib=1.9, ops=False,
                  transfers=False, models=["tiny-cnn", "tiny-mlp"])  # fmt: skip
    summary = Profiler(cfg).run(show_progress=False)
    assert summary.oom == [("tiny-cnn", "fp32", 2), ("tiny-mlp", "fp32", 1)]
    assert summary.skipped_after_oom == [("tiny-cnn", "fp32", 4), ("tiny-mlp", "fp32", 2), ("tiny-mlp", "fp32", 4)]
    assert summary.done == [("tiny-cnn", "fp32", 1)]
    limits = _csv(tmp_path / "details" / "limits-v100-pcie-32gb.csv")
    assert [(r["workload"], r["oom_batch_size"], r["max_fit_batch_size"]) for r in limits] == [
        ("tiny-cnn", "2", "1"),
        ("tiny-mlp", "1", "0"),
    ]
    # a resumed run remembers the limit and does not retry
    again = Profiler(cfg).run(show_progress=False)
    assert again.oom == [] and ("tiny-cnn", "fp32", 2) in again.skipped_after_oom


def test_deadline_stops_before_the_first_configuration(tmp_path: Path) -> None:
    summary = Profiler(_config(tmp_path, deadline_s=0.0, transfers=False)).run(show_progress=False)
    assert summary.stopped_at_deadline and summary.done == []


def test_rows_drive_an_emulated_timeline(dry_run: tuple[Path, RunSummary]) -> None:
    _, summary = dry_run
    rows = {(r["phase"], r["batch_size"], r["dtype"]): float(str(r["value"]))
            for r in read_native_profile(summary.profile_path)}  # fmt: skip
    fwd, bwd = rows[("forward", 2, "fp32")], rows[("backward", 2, "fp32")]
    gpu = EmulatedGPU(str(read_native_profile(summary.profile_path)[0]["gpu"]), clock=ManualClock())
    gpu.default_stream.enqueue(fwd, "forward")
    work = gpu.default_stream.enqueue(bwd, "backward")
    # launch at t=0: forward starts after the 5 us launch overhead of the V100, backward right after it
    assert work.end_s == pytest.approx(gpu.spec.launch_overhead_us * 1e-6 + fwd + bwd)


def test_rows_load_into_the_profile_db(dry_run: tuple[Path, RunSummary]) -> None:
    profiles = pytest.importorskip("gpemu.profiles")
    if not hasattr(profiles, "ProfileDB"):
        pytest.skip("gpemu.profiles.ProfileDB not written yet")
    _, summary = dry_run
    db = profiles.ProfileDB.from_paths([summary.profile_path])
    row = next(r for r in read_native_profile(summary.profile_path)
               if (r["phase"], r["batch_size"], r["dtype"]) == ("forward", 2, "fp32"))  # fmt: skip
    with pytest.warns(profiles.GpemuWarning):  # only measured=0 rows: the DB flags the figure as a guess
        est = db.lookup("v100", "tiny-cnn", "forward", 2, "fp32")
    assert est.ok and est.kind != "measured"  # dry-run rows are measured=0
    assert est.value == pytest.approx(float(str(row["value"])))
