"""The profiling run: loop over (model, dtype, batch size), measure, write rows as it goes, stop cleanly at OOM."""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpemu.errors import GpemuError
from gpemu.profiler.measure import (
    STEP_PHASES,
    OpTime,
    Spread,
    TrainingStep,
    measure_copies,
    measure_model_h2d,
    measure_step,
    profile_ops,
    spread_of,
)
from gpemu.profiler.provenance import Provenance, collect
from gpemu.profiler.store import ProfileStore, Row
from gpemu.profiler.target import Target, is_oom, make_target
from gpemu.profiler.workload import build_workload

# Copy sizes of the bandwidth curve: 4 KiB to 1 GiB in steps of 4x (dry run: up to 16 MiB).
CURVE_SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**i for i in range(10))
DRY_RUN_CURVE_SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**i for i in range(7))


@dataclass
class ProfileConfig:
    """What to profile and how."""

    models: list[str]
    batch_sizes: list[int]
    dtypes: list[str]
    out_dir: Path
    gpu_index: int = 0
    warmup: int = 5
    reps: int = 20
    dry_run: bool = False
    ops: bool = True
    op_batch_sizes: set[int] | None = None  # None = profile ops at every batch size
    op_steps: int = 3
    transfers: bool = True
    bandwidth_sizes_bytes: tuple[int, ...] | None = None  # None = CURVE_SIZES_BYTES (dry run: the small set)
    gpu_name: str | None = None  # override the device name used for the gpu column
    memory_limit_mib: float | None = None  # dry run only: fake device memory, to exercise the OOM path
    resume: bool = True
    deadline_s: float | None = None  # time.monotonic() after which no new configuration starts
    keep_going: bool = False  # record a non-OOM failure of one configuration and go on (campaigns)


@dataclass
class RunSummary:
    """What a profiling run did."""

    gpu_key: str
    profile_path: Path
    done: list[tuple[str, str, int]] = field(default_factory=list)  # (model, dtype, batch)
    resumed: list[tuple[str, str, int]] = field(default_factory=list)  # already in the output: skipped
    oom: list[tuple[str, str, int]] = field(default_factory=list)  # first batch that did not fit
    skipped_after_oom: list[tuple[str, str, int]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (model or model/dtype/batch, first error line)
    stopped_at_deadline: bool = False
    rows: int = 0


def _row(prov: Provenance, source: str, workload: str, phase: str, batch: int, dtype: str, value: float,
         unit: str) -> Row:  # fmt: skip
    return {"gpu": prov.gpu_key, "workload": workload, "phase": phase, "batch_size": batch, "dtype": dtype,
            "value": value, "unit": unit, "measured": prov.measured, "source": source}  # fmt: skip


def _spread_row(prov: Provenance, source: str, workload: str, phase: str, batch: int, dtype: str, s: Spread) -> Row:
    return {"gpu": prov.gpu_key, "workload": workload, "phase": phase, "batch_size": batch, "dtype": dtype,
            "unit": "s", "n": s.n, "mean": s.mean, "std": s.std, "min": s.min, "p10": s.p10, "p50": s.p50,
            "p90": s.p90, "max": s.max, "measured": prov.measured, "source": source}  # fmt: skip


def _bandwidth_rows(prov: Provenance, source: str, size_bytes: int, copies: dict[str, list[float]]) -> list[Row]:
    rows = []
    for phase, values in copies.items():
        s = spread_of(values)
        direction, memory = phase.split("_")
        rows.append({"gpu": prov.gpu_key, "direction": direction, "memory": memory, "size_bytes": size_bytes,
                     "time_s": s.p50, "p10_s": s.p10, "p90_s": s.p90,
                     "bw_gbps": size_bytes / s.p50 / 1e9 if s.p50 > 0 else float("nan"),
                     "measured": prov.measured, "source": source})  # fmt: skip
    return rows


def _op_rows(prov: Provenance, source: str, workload: str, batch: int, dtype: str, ops: list[OpTime]) -> list[Row]:
    return [{"gpu": prov.gpu_key, "workload": workload, "batch_size": batch, "dtype": dtype, "op": o.op,
             "input_shapes": o.input_shapes, "calls_per_step": o.calls_per_step, "device_time_us": o.device_time_us,
             "self_device_time_us": o.self_device_time_us, "cpu_time_us": o.cpu_time_us,
             "measured": prov.measured, "source": source} for o in ops]  # fmt: skip


class Profiler:
    """Runs a ProfileConfig against a target and writes a ProfileStore."""

    def __init__(self, config: ProfileConfig, target: Target | None = None, prov: Provenance | None = None) -> None:
        self.config = config
        self.prov = prov or collect(config.gpu_index, dry_run=config.dry_run, gpu_name=config.gpu_name)
        self.target = target or make_target(config.dry_run, config.gpu_index, config.memory_limit_mib)
        self.store = ProfileStore(config.out_dir, self.prov.gpu_key, resume=config.resume)
        self.source = self.prov.source(stat="p50", warmup=config.warmup, reps=config.reps)
        self._copies: dict[int, dict[str, list[float]]] = {}

    def _past_deadline(self) -> bool:
        return self.config.deadline_s is not None and time.monotonic() >= self.config.deadline_s

    def _copy_samples(self, size_bytes: int) -> dict[str, list[float]]:
        if size_bytes not in self._copies:
            c = self.config
            self._copies[size_bytes] = measure_copies(self.target, size_bytes, min(c.warmup, 3), c.reps)
            if not self.store.has_bandwidth(size_bytes):
                self.store.add_details("bandwidth", _bandwidth_rows(self.prov, self.source, size_bytes,
                                                                    self._copies[size_bytes]))  # fmt: skip
        return self._copies[size_bytes]

    def bandwidth_curve(self) -> None:
        """Measure the copy curve (every size not yet in the output)."""
        c = self.config
        sizes = c.bandwidth_sizes_bytes or (DRY_RUN_CURVE_SIZES_BYTES if c.dry_run else CURVE_SIZES_BYTES)
        for size in sizes:
            if self._past_deadline():
                return
            if not self.store.has_bandwidth(size):
                self._copy_samples(size)
        self.store.flush()

    def profile_config(self, name: str, host_model: object, batch: int, dtype: str) -> None:
        """Measure one (model, batch, dtype) and add its rows to the store (raises on OOM)."""
        c, prov, src = self.config, self.prov, self.source
        workload = build_workload(name, batch, model=copy.deepcopy(host_model))  # type: ignore[arg-type]
        rows: list[Row] = []
        spreads: list[Row] = []
        if c.transfers:
            for phase, values in self._copy_samples(workload.inputs.nbytes).items():
                s = spread_of(values)
                rows.append(_row(prov, src, name, phase, batch, dtype, s.p50, "s"))
                spreads.append(_spread_row(prov, src, name, phase, batch, dtype, s))
        self.target.empty_cache()  # so mem_reserved is not inflated by blocks cached for the previous configuration
        step = TrainingStep(self.target, workload, dtype)
        result = measure_step(step, c.warmup, c.reps)
        for phase in STEP_PHASES:
            s = spread_of(result.samples[phase])
            rows.append(_row(prov, src, name, phase, batch, dtype, s.p50, "s"))
            spreads.append(_spread_row(prov, src, name, phase, batch, dtype, s))
        for phase, mib in result.memory_mib.items():
            rows.append(_row(prov, src, name, phase, batch, dtype, mib, "MiB"))
        ops: list[OpTime] = []
        if c.ops and (c.op_batch_sizes is None or batch in c.op_batch_sizes):
            ops = profile_ops(self.target, step, c.op_steps)
        del step, workload
        self.store.add_rows(rows)
        self.store.add_details("spread", spreads)
        self.store.add_details("ops", _op_rows(prov, src, name, batch, dtype, ops))

    def model_h2d(self, name: str, host_model: object) -> None:
        """Measure the pageable copy of the whole model once; write a batch-0 row per dtype."""
        model = copy.deepcopy(host_model)
        values = measure_model_h2d(self.target, model)  # type: ignore[arg-type]
        del model
        s = spread_of(values)
        self.store.add_rows(_row(self.prov, self.source, name, "model_h2d", 0, dtype, s.p50, "s")
                            for dtype in self.config.dtypes)  # fmt: skip

    def run(self, show_progress: bool = True, console: Console | None = None) -> RunSummary:
        """Profile every configuration (resuming, stopping at OOM per (model, dtype) and at the deadline)."""
        c = self.config
        summary = RunSummary(self.prov.gpu_key, self.store.profile_path)
        plan = [(m, d, b) for m in c.models for d in c.dtypes for b in c.batch_sizes]
        with _progress(show_progress, console) as progress:
            task = progress.add_task("bandwidth curve", total=len(plan))
            if c.transfers:
                self.bandwidth_curve()
            for name in c.models:
                host_model = None
                for dtype in c.dtypes:
                    oom_at = self.store.oom_batch(name, dtype)
                    for batch in c.batch_sizes:
                        key = (name, dtype, batch)
                        progress.update(task, description=f"{name} {dtype} b{batch}")
                        if self._past_deadline():
                            summary.stopped_at_deadline = True
                            break
                        if oom_at is not None and batch >= oom_at:
                            summary.skipped_after_oom.append(key)
                        elif c.resume and self.store.has_config(name, batch, dtype):
                            summary.resumed.append(key)
                        else:
                            if host_model is None:
                                try:
                                    host_model = build_workload(name, 1).model
                                except GpemuError as exc:  # unknown model: skip it when keep_going
                                    if not c.keep_going:
                                        raise
                                    summary.failed.append((name, str(exc)))
                                    break
                                if c.transfers:
                                    self.model_h2d(name, host_model)
                            status = self._try_config(name, host_model, batch, dtype, summary)
                            if status == "ok":
                                summary.done.append(key)
                            elif status == "oom":
                                oom_at = batch
                            self.store.flush()
                        progress.advance(task)
                    if summary.stopped_at_deadline or (summary.failed and summary.failed[-1][0] == name):
                        break
                del host_model
                self.target.empty_cache()
                if summary.stopped_at_deadline:
                    break
        self.store.flush()
        summary.rows = len(self.store.rows)
        return summary

    def _try_config(self, name: str, host_model: object, batch: int, dtype: str, summary: RunSummary) -> str:
        """Profile one configuration; return "ok", "oom" (limit recorded, memory freed) or "failed" (keep_going)."""
        error = None
        try:
            self.profile_config(name, host_model, batch, dtype)
        except Exception as exc:
            if not is_oom(exc):
                if not self.config.keep_going:
                    raise
                summary.failed.append((f"{name}/{dtype}/b{batch}", f"{type(exc).__name__}: {exc}".splitlines()[0]))
                gc.collect()
                self.target.empty_cache()
                return "failed"  # not a memory limit: larger batch sizes are still worth trying
            error = str(exc).splitlines()[0][:200]
        if error is None:
            return "ok"
        gc.collect()
        self.target.empty_cache()
        fits = [b for b in self.config.batch_sizes if b < batch and self.store.has_config(name, b, dtype)]
        self.store.add_details("limits", [{"gpu": self.prov.gpu_key, "workload": name, "dtype": dtype,
                                           "oom_batch_size": batch, "max_fit_batch_size": max(fits, default=0),
                                           "error": error, "source": self.source}])  # fmt: skip
        summary.oom.append((name, dtype, batch))
        return "oom"


@contextmanager
def _progress(enabled: bool, console: Console | None) -> Iterator[Progress]:
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
    with progress:
        yield progress


def run_profile(config: ProfileConfig, show_progress: bool = True) -> RunSummary:
    """Profile `config` on its target (CUDA, or the CPU on a dry run); return the run summary."""
    return Profiler(config).run(show_progress=show_progress)
