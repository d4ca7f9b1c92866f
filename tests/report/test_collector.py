"""Run-report numbers on a ManualClock-driven loop, where every figure can be derived by hand."""

from __future__ import annotations

import pytest

from gpemu.device import ManualClock
from gpemu.device.api import Emulator
from gpemu.report import EngineLog, RunCollector, iteration_rows, summarize

MB = 10**6


def test_engine_log_busy_in_window() -> None:
    log = EngineLog()
    log.add(0.0, 1.0)
    log.add(1.0, 2.0)  # touches: merged into [0, 2)
    log.add(3.0, 4.0)
    assert len(log.starts) == 2
    assert log.busy_in(0.5, 3.5) == pytest.approx(2.0)  # 1.5 of [0,2) + 0.5 of [3,4)
    assert log.busy_in(2.0, 3.0) == 0.0
    assert log.busy_in(-1.0, 10.0) == pytest.approx(3.0)
    assert log.busy_in_spans([(0.0, 0.5), (3.5, 5.0)]) == pytest.approx(1.0)


def _run() -> tuple[Emulator, RunCollector]:
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    # iteration 0: 30 ms data wait, 1 ms pinned H2D (11.5e6 B / 11.5 GB/s), 20 ms compute, then sync (loss.item()).
    clock.advance(0.030)
    col.on_fetch(0.0, 0.030)
    emu.h2d(11_500_000)
    emu.compute(0.020)
    emu.synchronize()
    # iteration 1: 10 ms data wait, same step.
    t = clock.now()
    clock.advance(0.010)
    col.on_fetch(t, clock.now())
    emu.h2d(11_500_000)
    emu.compute(0.020)
    emu.synchronize()
    # iteration 2: no data wait, a 50 ms kernel launched without a sync; the next fetch comes 18 ms later.
    col.mark_iteration()
    emu.compute(0.050)
    clock.advance(0.018)
    # iteration 3: starts at 0.1; the loader is exhausted at 0.2.
    col.mark_iteration()
    clock.advance(0.100)
    col.on_exhausted(clock.now())
    return emu, col


def test_iteration_rows_by_hand() -> None:
    _, col = _run()
    rows = iteration_rows(col)
    assert len(rows) == 4
    r0, r1, r2, r3 = rows
    # iteration 0: [0, 0.051): the copy runs 0.030-0.031, the kernel max(0.030 + 5 us, 0.031) = 0.031 to 0.051.
    assert r0["wall_s"] == pytest.approx(0.051)
    assert r0["data_wait_s"] == pytest.approx(0.030)
    assert r0["h2d_s"] == pytest.approx(0.001)
    assert r0["gpu_busy_s"] == pytest.approx(0.020)
    assert r0["gpu_idle_s"] == pytest.approx(0.031)  # 0.051 - 0.020
    assert r0["gpu_idle_data_s"] == pytest.approx(0.030)  # the GPU was idle during the whole fetch
    assert r0["sync_wait_s"] == pytest.approx(0.021)  # host waited 0.030 -> 0.051
    assert r0["fetch_stall_pct"] == pytest.approx(100 * 0.030 / 0.051)  # 58.8 %
    assert r0["h2d_bytes"] == 11_500_000
    # iteration 1: [0.051, 0.082): 10 ms fetch, copy 0.061-0.062, kernel 0.062-0.082.
    assert r1["wall_s"] == pytest.approx(0.031)
    assert r1["gpu_busy_pct"] == pytest.approx(100 * 0.020 / 0.031)  # 64.5 %
    # iteration 2: [0.082, 0.100): the kernel starts at 0.082005 and is still running when the window closes.
    assert r2["wall_s"] == pytest.approx(0.018)
    assert r2["gpu_busy_s"] == pytest.approx(0.100 - 0.082005)
    # iteration 3: [0.100, 0.200): the rest of that kernel, 0.100 -> 0.132005.
    assert r3["wall_s"] == pytest.approx(0.100)
    assert r3["gpu_busy_s"] == pytest.approx(0.032005)
    assert not any(r["partial"] for r in rows)
    # by launch: the 50 ms kernel belongs to iteration 2, which launched it, though it ran mostly in iteration 3
    assert [r["gpu_work_s"] for r in rows] == pytest.approx([0.020, 0.020, 0.050, 0.0])


def test_work_after_the_epoch_ends_still_counts_for_its_iteration() -> None:
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    col.mark_iteration()
    emu.compute(0.100)  # launched at 0, runs 5 us -> 0.100005
    clock.advance(0.010)
    col.on_exhausted(clock.now())  # the host hits the end of the loader while the kernel runs
    (row,) = iteration_rows(col)
    assert row["wall_s"] == pytest.approx(0.100005)  # closed when the kernel it launched finished, not at 10 ms
    assert row["gpu_busy_s"] == pytest.approx(0.100)
    assert row["gpu_work_s"] == pytest.approx(0.100)
    # a next epoch that fetches before the GPU is done cuts the window at its first fetch
    col.mark_iteration()
    emu.compute(0.100)  # runs 0.100005 -> 0.200005
    col.on_exhausted(clock.now())  # closes at 0.200005
    clock.advance(0.140)
    col.on_fetch(clock.now(), clock.now())  # at 0.150
    assert col.iterations[1].end_s == pytest.approx(0.150)


def test_a_prefetching_loaders_last_batch_after_the_loader_ran_out_is_an_iteration() -> None:
    # timm's PrefetchLoader fetches batch k+1 before yielding batch k (Note [Prefetching loaders]): its last batch
    # runs after the DataLoader raised StopIteration. That step was in no iteration; now a tail window holds it.
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    col.on_fetch(0.0, 0.0)  # batch 0 fetched; nothing runs yet (the prefetcher only copies it)
    clock.advance(0.001)
    col.on_fetch(clock.now(), clock.now())  # batch 1 fetched at 1 ms, then batch 0 runs
    emu.compute(0.020)
    emu.synchronize()  # loss.item(): the host waits until 21 ms
    col.note_training()
    col.on_exhausted(clock.now())  # at 21 ms: the loader ran out; the prefetcher now yields batch 1
    emu.compute(0.020)  # 21 -> 41 ms
    emu.synchronize()
    col.note_training()
    clock.advance(0.004)
    col.on_fetch(clock.now(), clock.now())  # at 45 ms: validation's first fetch
    rows = iteration_rows(col)
    assert [r["train"] for r in rows[:3]] == [False, True, True]
    # (each kernel launch adds the V100's 5 us launch latency to the host clock: hence abs=1e-4)
    assert rows[1]["gpu_work_s"] == pytest.approx(0.020) and rows[1]["wall_s"] == pytest.approx(0.020, abs=1e-4)
    tail = rows[2]  # the batch-1 step: 21 -> 45 ms, 20 ms of it on the GPU
    assert tail["gpu_work_s"] == pytest.approx(0.020) and tail["wall_s"] == pytest.approx(0.024, abs=1e-4)
    # a loop that launches nothing after its loader runs out gets no tail row, and the run's last one is dropped too
    clock.advance(0.010)
    col.on_exhausted(clock.now())
    col.finish()
    assert len(iteration_rows(col)) == 4


def test_a_window_that_called_no_model_is_not_an_evaluation_iteration() -> None:
    # Note [Windows without a model call]: a prefetching loader's first window per epoch only copies and normalises
    # the next batch; with no backward it was an "evaluation iteration" of ~0.1 ms of GPU work
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    calls = [0]
    col = RunCollector(emu.devices, clock=clock.now, calls_meter=lambda: calls[0])
    for _ in range(4):  # training: one module call and a backward per window
        col.mark_iteration()
        calls[0] += 1
        emu.compute(0.010)
        emu.synchronize()
        col.note_training()
    col.mark_iteration()  # the evaluation loader's first window: the prefetch's normalisation only
    emu.compute(0.0001)
    emu.synchronize()
    col.mark_iteration()  # an evaluation forward
    calls[0] += 1
    emu.compute(0.005)
    emu.synchronize()
    col.mark_iteration()
    rows = iteration_rows(col)
    assert [r["module_calls"] for r in rows[4:6]] == [0, 1]
    summary = summarize(rows, warmup=1)
    assert summary["evaluation"]["iterations"] == 1  # the forward, not the prefetch window too
    assert summary["evaluation"]["gpu_work_s"]["mean"] == pytest.approx(0.005)
    assert "1 iteration(s) with no GPU work or no model call left out" in summary["note"]


def test_summary_skips_warmup() -> None:
    _, col = _run()
    summary = summarize(iteration_rows(col), warmup=1)
    assert summary["iterations_used"] == 3
    assert summary["wall_s"]["mean"] == pytest.approx((0.031 + 0.018 + 0.100) / 3)
    # busy over iterations 1-3: 0.020 + 0.017995 + 0.032005 = 0.070 of 0.149 s of wall.
    assert summary["gpu_busy_pct"] == pytest.approx(100 * 0.070 / 0.149)
    assert summary["fetch_stall_pct"] == pytest.approx(100 * 0.010 / 0.149)


def test_open_iteration_is_closed_partial_at_last_gpu_activity() -> None:
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    col.mark_iteration()
    emu.compute(0.040)
    emu.synchronize()  # host activity ends at 0.040005
    clock.advance(5.0)  # e.g. saving a checkpoint before exit
    col.finish()
    (row,) = iteration_rows(col)
    assert row["partial"]
    assert row["wall_s"] == pytest.approx(0.040005)


def _row(wall_s: float, busy_s: float, emulator_s: float) -> dict[str, object]:
    row: dict[str, object] = {key: 0.0 for key in ("data_wait_s", "h2d_s", "gpu_idle_data_s", "sync_wait_s")}
    row.update(wall_s=wall_s, gpu_busy_s=busy_s, gpu_work_s=busy_s, gpu_idle_s=wall_s - busy_s, emulator_s=emulator_s, partial=False)
    return row


def test_a_run_bound_by_the_emulator_is_flagged() -> None:
    # 3 iterations of 100 ms: GPU busy 20 ms, emulator's own host work 60 ms -> 60% >= 50% and idle 80% >= 25%
    bound = summarize([_row(0.100, 0.020, 0.060)] * 3, warmup=0)
    assert bound["emulation_bound"] and bound["emulator_s"]["median"] == pytest.approx(0.060)
    # the same emulator time on a GPU-bound run (busy 90 ms, idle 10% < 25%) is hidden behind the GPU: not flagged
    assert not summarize([_row(0.100, 0.090, 0.060)] * 3, warmup=0)["emulation_bound"]


def test_the_meter_is_read_at_iteration_boundaries() -> None:
    meter = {"v": (0.0, 0)}
    clock = ManualClock()
    col = RunCollector([], clock.now, emulator_meter=lambda: meter["v"])
    col.mark_iteration()
    meter["v"] = (0.004, 120)  # 4 ms and 120 ops of emulator work during the first iteration
    clock.advance(0.010)
    col.mark_iteration()
    clock.advance(0.010)
    col.finish()
    rows = iteration_rows(col)
    assert rows[0]["emulator_s"] == pytest.approx(0.004) and rows[0]["emulator_ops"] == 120
    assert rows[1]["emulator_s"] == 0.0  # nothing moved during the second


def test_compute_time_is_split_by_where_it_came_from() -> None:
    from gpemu.report import report_dict
    from gpemu.report.summary import timing_line

    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    stream = emu.devices[0].default_stream
    stream.enqueue(0.030, "conv", "compute", "kernel", {"timing": "calibrated"})
    stream.enqueue(0.010, "loss", "compute", "kernel", {"timing": "predicted"})
    stream.enqueue(0.010, "other", "compute", "kernel")  # no label: the cost model's
    report = report_dict(col, meta={"timing": {"profiles": {"resnet50/32/fp32/forward": 0.030}}})
    # 30 of 50 ms calibrated = 60 %
    assert report["timing"]["calibrated_pct"] == pytest.approx(60.0)
    assert report["timing"]["compute_s_by_source"]["predicted"] == pytest.approx(0.020)
    assert timing_line(report["timing"]).startswith("GPU time: 60% calibrated to measured profiles "
                                                    "(resnet50/32/fp32/forward 30.0 ms)")
    assert "all predicted per op" in timing_line({"compute_s_by_source": {"predicted": 1.0}, "calibrated_pct": 0.0})
    # Note [CUDA graphs]: replayed graph work is labelled apart: 3 of 4 s
    assert "75% replayed from CUDA graphs" in timing_line({"compute_s_by_source": {"predicted": 1.0, "cuda-graph": 3.0},
                                                           "calibrated_pct": 0.0})
    # Note [Published bias per GPU]: how the published rows of the GPU lean follows predicted time, never a run
    # calibrated to measured profiles throughout
    lean = [{"gpu": "h100-sxm5-80gb", "model_kind": "lm-pretrain", "rows": 13, "signed_median_pct": 21.05,
             "median_abs_pct": 21.05, "basis": "b"}]
    line = timing_line({"compute_s_by_source": {"predicted": 1.0}, "calibrated_pct": 0.0, "published_bias": lean})
    assert line.endswith("Published real-GPU throughputs on h100-sxm5-80gb (signed medians, not corrected): LLM "
                         "pretraining gpemu 21% faster (13 rows); docs/cost-model.md")
    assert "Published" not in timing_line({"compute_s_by_source": {"calibrated": 1.0}, "calibrated_pct": 100.0,
                                           "published_bias": lean})


def test_evaluation_iterations_are_summarised_apart() -> None:
    train = {**_row(0.100, 0.090, 0.0), "train": True, "gpu_work_s": 0.090}
    evaluation = {**_row(0.040, 0.030, 0.0), "train": False, "gpu_work_s": 0.030}
    summary = summarize([train, train, train, evaluation, evaluation], warmup=1)
    assert summary["iterations_used"] == 2  # iterations 1-2 train; 3-4 evaluate
    assert summary["wall_s"]["mean"] == pytest.approx(0.100)
    assert summary["evaluation"]["iterations"] == 2
    assert summary["evaluation"]["gpu_work_s"]["mean"] == pytest.approx(0.030)
    # an inference-only run has no training iterations: everything is summarised
    only = summarize([evaluation] * 3, warmup=1)
    assert only["iterations_used"] == 2 and "evaluation" not in only


def test_iterations_with_no_gpu_work_are_left_out_not_called_evaluation() -> None:
    # Note [Iterations with no GPU work]: a `next(iter(loader))` probe before each epoch opens an iteration with
    # nothing on the device
    train = {**_row(0.002, 0.0001, 0.0004), "train": True, "emulator_ops": 13}
    probe = {**_row(0.0006, 0.0, 0.0), "train": False, "emulator_ops": 0}
    summary = summarize([probe, train, train, train, probe, train, train], warmup=1)
    assert summary["iterations_used"] == 5  # the 5 training rows after the warm-up row (the first probe)
    assert "evaluation" not in summary
    assert "1 iteration(s) with no GPU work or no model call left out" in summary["note"]
    assert summary["wall_s"]["mean"] == pytest.approx(0.002)
    # an evaluation row (GPU work, no backward) is still summarised apart
    evaluation = {**_row(0.001, 0.0005, 0.0), "train": False, "emulator_ops": 3}
    both = summarize([probe, train, train, train, probe, evaluation, train], warmup=1)
    assert both["evaluation"]["iterations"] == 1 and both["iterations_used"] == 4


def test_a_backward_pass_marks_its_iteration_as_training() -> None:
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    col.mark_iteration()
    col.note_training()
    col.mark_iteration()  # no backward in this one
    col.finish()
    assert [w.trained for w in col.iterations] == [True, False]


def test_a_fetch_the_loop_never_used_is_not_an_iteration() -> None:
    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    col.mark_iteration()
    emu.compute(0.100)  # launched at 0, runs 5 us -> 0.100005; the host runs ahead
    clock.advance(0.010)
    col.mark_iteration()  # `for i, batch in enumerate(loader): if i >= iters: break` fetched one more batch
    clock.advance(0.200)  # e.g. torch.save at the end
    col.finish()
    (row,) = iteration_rows(col)
    assert not row["partial"]
    assert row["wall_s"] == pytest.approx(0.100005)  # the iteration lasts until its GPU work is done


def test_the_emulators_recording_steps_are_skipped_as_warm_up() -> None:
    # Note [Emulator warm-up]: ops per row 1100 (warm-up), 1096 and 775 (per-op recording), then 25 per replayed step
    def row(wall_s: float, ops: int) -> dict[str, object]:
        return {**_row(wall_s, 0.040, 0.0), "emulator_ops": ops}

    rows = [row(0.090, 1100), row(0.374, 1096), row(0.066, 775)] + [row(0.045, 25)] * 4
    summary = summarize(rows, warmup=1)
    # 1096 and 775 > 2 x median(25) -> both skipped; the mean is the replayed steps' 45 ms, not (374+66+4*45)/6
    assert summary["iterations_used"] == 4
    assert summary["wall_s"]["mean"] == pytest.approx(0.045)
    assert "2 of them the emulator's own" in summary["note"]
    # a script whose op count never drops (no replay) skips only the fixed warm-up
    flat = summarize([row(0.050, 700)] * 6, warmup=1)
    assert flat["iterations_used"] == 5 and "emulator" not in flat["note"]
    # too few rows after it: nothing extra is skipped (3 steady rows must remain)
    short = summarize([row(0.1, 10), row(0.374, 1096), row(0.045, 25), row(0.045, 25)], warmup=1)
    assert short["iterations_used"] == 3


def test_later_iterations_that_recorded_per_op_are_left_out() -> None:
    # Note [Recording steps later on]: dynamic padding gives a new sequence length now and then; the iteration that
    # meets it records per op (slow: the emulator's host work), the others replay
    def row(wall_s: float, ops: int, recorded: int) -> dict[str, object]:
        return {**_row(wall_s, 0.040, 0.0), "emulator_ops": ops, "recorded_calls": recorded}

    steady = [row(0.045, 25, 0)] * 6
    rows = [row(0.090, 1100, 1), row(0.374, 1096, 1), *steady[:3], row(0.300, 1090, 1), *steady[3:]]
    summary = summarize(rows, warmup=1)
    # skipped: 1 fixed warm-up + 1 leading recording (1096 > 2 x median 25); the 300 ms row in the middle recorded a
    # new key: left out, so the mean is the replayed rows' 45 ms, not (6 * 45 + 300) / 7 = 81.4 ms
    assert summary["iterations_used"] == 6
    assert summary["wall_s"]["mean"] == pytest.approx(0.045)
    assert "1 later iteration(s) left out" in summary["note"]
    # a model that never replays records in every row: nothing is left out
    never = summarize([row(0.3, 1000, 1)] * 6, warmup=1)
    assert never["iterations_used"] == 5 and "later" not in never["note"]


def test_the_last_training_step_ends_where_a_new_loader_starts_not_after_the_checkpoint() -> None:
    # Note [The last training step]: the HF Trainer stops at max_steps without exhausting its loader, saves a
    # checkpoint, then fetches from the evaluation loader; the last training iteration held the checkpoint.
    class Loader:  # stands for a DataLoader iterator (weakly referenced by the collector)
        pass

    clock = ManualClock()
    emu = Emulator("v100", clock=clock)
    col = RunCollector(emu.devices, clock=clock.now)
    train, evaluation = Loader(), Loader()
    for _ in range(4):  # 4 steps: fetch at t, 20 ms kernel, loss.item() sync, backward + step marked
        t = clock.now()
        col.on_fetch(t, t, train)
        emu.compute(0.020)
        emu.synchronize()
        col.note_training()
    clock.advance(0.500)  # the checkpoint: 0.5 s of host time (torch.save, save_state)
    emu.d2h(64 * MB)  # and 64 MB copied to the host (a few ms on the copy engine)
    emu.compute(0.001)  # a 1 ms kernel around it (e.g. a state-dict cast)
    emu.synchronize()
    t = clock.now()
    col.on_fetch(t, t, evaluation)  # the evaluation loader's first fetch
    clock.advance(0.001)
    col.on_exhausted(clock.now())
    rows = iteration_rows(col)
    train_rows = [r for r in rows if r["train"]]
    assert len(train_rows) == 4
    # every training iteration is its 20 ms step (+ the 5 us launch latency on the host clock); the last one read
    # 20 ms + 0.5 s + ~5.6 ms + 1 ms before
    assert [r["wall_s"] for r in train_rows] == pytest.approx([0.020005] * 4, abs=1e-5)
    last = train_rows[-1]
    # kept on the row: the span from the step's end to the evaluation fetch, 0.5 s + the copy + the kernel
    assert last["after_step_s"] == pytest.approx(t - (last["start_s"] + last["wall_s"]))  # run starts at 0
    assert 0.501 < last["after_step_s"] < 0.52
    assert last["after_step_gpu_work_s"] == pytest.approx(0.001)  # the cut-off span's kernel, kept on the row
    assert last["gpu_work_s"] == pytest.approx(0.020)
    summary = summarize(rows, warmup=1)
    assert summary["wall_s"]["mean"] == pytest.approx(summary["wall_s"]["median"], rel=1e-3)
    assert "ended at their last step when a new loader started" in summary["note"]
    # the same iterator fetching again (a mid-run checkpoint) keeps the checkpoint in its iteration
    col.on_fetch(clock.now(), clock.now(), train)
    emu.compute(0.020)
    emu.synchronize()
    col.note_training()
    clock.advance(0.300)
    col.on_fetch(clock.now(), clock.now(), train)
    assert col.iterations[-2].end_s - col.iterations[-2].start_s == pytest.approx(0.320005, abs=1e-5)
