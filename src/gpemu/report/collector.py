"""Run collector: iteration boundaries, data-fetch spans and per-engine busy intervals of emulated devices."""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpemu.device.gpu import EmulatedGPU

# Note [Iterations]
# ~~~~~~~~~~~~~~~~~
# An iteration is the span from the start of one batch fetch (DataLoader __next__, or an explicit mark) to the start
# of the next one. Its data wait is the host time blocked inside the fetch. A fetch that raises StopIteration closes
# the open iteration without opening one (time between epochs -- validation, iterator start-up -- belongs to no
# iteration). The iteration still open when the run ends closes at the later of the host's last GPU interaction and
# the GPU finishing that work, and is flagged partial (the summary leaves partial iterations out when it has others)
# -- unless it launched no GPU work (the loop fetched a batch and broke out): then it is dropped and the iteration
# before it ends when the GPU finishes.
# GPU figures of an iteration are engine busy time *inside its wall-clock window* (work launched earlier but
# running in it counts), so busy + idle = wall exactly. The host runs ahead of the GPU (launches are asynchronous), so
# a window's busy time is not the GPU time of the iteration's own work; that is counted separately, by launch time
# (`launched_s`: the engine seconds of every item launched inside the window, wherever it ran). At the end of an epoch
# the host may stop launching while the GPU still runs the last iteration: that iteration closes when the GPU finishes
# the work launched so far (or at the next epoch's first fetch, if that comes sooner), so an epoch's tail is not lost.
# Note [GPU waits inside a fetch]: a dataset that moves each sample to the device in __getitem__ (lucidrains'
# x-transformers train_enwik8.py: `full_seq.cuda()` from pageable memory, in a 0-worker DataLoader) makes the fetch
# wait for the GPU's queued work, as CUDA's pageable copy does. That wait was counted as data wait: the enwik8 run read
# 71.5 % fetch stall beside 97 % GPU busy (session 15). Time the host spends blocked on a device inside a fetch is now
# the GPU's: it leaves the data wait (fetch stall) and joins that iteration's sync wait; a fetch that does not touch
# the device is unchanged.
# Note [Prefetching loaders]: a loader wrapper that fetches one batch ahead (timm's PrefetchLoader, NVIDIA apex's
# data_prefetcher, `cuda_prefetcher.py`) fetches batch k+1 before it yields batch k, so it yields its last batch after
# the DataLoader raised StopIteration. That step then ran outside any iteration: timm's train.py lost one training
# step per epoch, and its validation (one batch per loader) reported evaluation iterations of 0.1 ms of GPU work (the
# prefetch's normalisation) where the ResNet-50 forward takes ~16 ms. So an exhausted fetch opens a tail window at
# the host's moment of exhaustion, lasting until the next fetch or the end of the run. It becomes an iteration only if
# GPU compute was launched or a backward pass ran in it (the iteration before it then ends where the tail starts);
# else it is forgotten and the report reads as before (a plain loop launches no kernel between its last step and
# the next loader's first fetch: a checkpoint's device-to-host copies and the near-free bookkeeping ops around it, under
# TAIL_MIN_COMPUTE_S of kernels in all, do not count).
TAIL_MIN_COMPUTE_S = 1e-6

# Note [The last training step]: a training loop that stops without exhausting its loader (the HF Trainer at
# max_steps, Lightning at limit_train_batches), or whose last batch runs in a prefetching loader's tail window (Note
# [Prefetching loaders]: accelerate's DataLoaderShard fetches one ahead), left its last training iteration open until
# the next fetch: the evaluation loader's first. That iteration then held everything the loop did after its last step
# -- the Trainer's checkpoint, save_model and save_state, 0.5-0.9 s of host time and ~64 MB of D2H copies for a 4-layer
# GPT-2 -- and the run report's means read far below its medians (run_clm: mean wall 59 ms, median 6.9 ms). What a
# researcher calls that iteration is the step: fetch, forward, backward, optimizer step. So every backward pass and
# optimizer step marks its window (StepMark: host time, when the GPU will finish the work launched so far, the
# counters), and when a fetch comes from a loader iterator the run has not fetched from before (a loader starting:
# evaluation, the next epoch, another phase), an open window that trained closes at its last mark: at the later of
# the host's step end and the GPU finishing the step's work (no later than the new fetch), as an epoch's last
# iteration does at StopIteration (Note [Iterations]). Its counters (syncs, H2D, emulator time, work launched) are
# the mark's. Nothing is dropped: the span cut off, from that end to the new loader's first fetch, and the GPU work
# launched in it are kept on the row (`after_step_s`, `after_step_gpu_work_s`), and the summary's note says how many
# iterations were cut and how long the cut-off spans were. A window that never trained (evaluation) and a fetch from
# the same iterator (the next batch of the loop: a mid-run checkpoint is part of its iteration, as on a real GPU) keep
# the old rule; so does the window still open when the run ends (closed partial, Note [Iterations]).


@dataclass
class StepMark:
    """What the collector read when a training step ended (Note [The last training step])."""

    host_s: float
    gpu_done_s: float
    sync_wait_s: float
    h2d_bytes: int
    emulator: tuple[float, int]
    recorded: int
    calls: int
    launched_s: dict[tuple[int, str], float]


class EngineLog:
    """Busy intervals of one engine, merged when they touch (work on one engine never overlaps)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._prefix: list[float] | None = None

    def add(self, start_s: float, end_s: float) -> None:
        """Append one busy interval (start order is guaranteed by the engine)."""
        if end_s <= start_s:
            return
        if self.ends and start_s <= self.ends[-1] + 1e-9:
            self.ends[-1] = max(self.ends[-1], end_s)
        else:
            self.starts.append(start_s)
            self.ends.append(end_s)
        self._prefix = None

    def busy_in(self, t0_s: float, t1_s: float) -> float:
        """Return the seconds this engine was busy inside [t0_s, t1_s)."""
        if t1_s <= t0_s or not self.starts:
            return 0.0
        if self._prefix is None:
            acc, prefix = 0.0, [0.0]
            for s, e in zip(self.starts, self.ends, strict=True):
                acc += e - s
                prefix.append(acc)
            self._prefix = prefix
        lo = bisect.bisect_right(self.ends, t0_s)  # first interval ending after t0
        hi = bisect.bisect_left(self.starts, t1_s)  # intervals [lo, hi) start before t1
        if hi <= lo:
            return 0.0
        total = self._prefix[hi] - self._prefix[lo]
        total -= max(0.0, t0_s - self.starts[lo])
        total -= max(0.0, self.ends[hi - 1] - t1_s)
        return max(0.0, total)

    def busy_in_spans(self, spans: Iterable[tuple[float, float]]) -> float:
        """Return the busy seconds summed over several disjoint spans."""
        return sum(self.busy_in(a, b) for a, b in spans)


@dataclass
class IterationWindow:
    """One iteration's raw window: [start_s, end_s), its fetch spans and counter snapshots at the start."""

    index: int
    epoch: int
    start_s: float
    end_s: float | None = None
    fetches: list[tuple[float, float]] = field(default_factory=list)
    fetch_sync_s: float = 0.0  # host waits on the GPU inside its fetches: Note [GPU waits inside a fetch]
    sync_wait_start_s: float = 0.0
    sync_wait_end_s: float = 0.0
    h2d_bytes_start: int = 0
    h2d_bytes_end: int = 0
    emulator_start: tuple[float, int] = (0.0, 0)  # (seconds, ops) of the emulator's own host work, at the start
    emulator_end: tuple[float, int] = (0.0, 0)
    recorded_start: int = 0  # calls the replay path recorded per op so far (Note [Recording steps later on])
    recorded_end: int = 0
    calls_start: int = -1  # module calls so far, -1 without a meter (Note [Windows without a model call])
    calls_end: int = -1
    partial: bool = False
    trained: bool = False  # a backward pass or an optimizer step ran in it (else: evaluation / inference)
    tail: bool = False  # opened by an exhausted fetch, kept only if it ran work (Note [Prefetching loaders])
    launched_s: dict[tuple[int, str], float] = field(default_factory=dict)  # (device, engine) -> seconds launched
    step_mark: StepMark | None = None  # the last training step's end (Note [The last training step])
    after_step_s: float = 0.0  # the span cut off after that step, and the compute launched in it
    after_step_gpu_work_s: float = 0.0


class RunCollector:
    """Collects what the run report needs from any loop: fetches, iteration marks and device work."""

    def __init__(
        self,
        devices: Callable[[], list[EmulatedGPU]] | list[EmulatedGPU] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        trace: Any = None,
        emulator_meter: Callable[[], tuple[float, int]] | None = None,
        recordings_meter: Callable[[], int] | None = None,
        calls_meter: Callable[[], int] | None = None,
    ) -> None:
        self._devices_provider = devices if callable(devices) else (lambda: list(devices or []))
        # (host seconds, ops) the emulator itself spent so far; see Note [Emulator host time] in torch_backend/tensor.py
        self.emulator_meter = emulator_meter
        self.recordings_meter = recordings_meter  # calls recorded per op by the replay path so far
        self.calls_meter = calls_meter  # module calls so far (drop-in mode)
        self.now = clock
        self.trace = trace
        self.devices: list[EmulatedGPU] = []
        self.logs: dict[tuple[int, str], EngineLog] = {}
        self.iterations: list[IterationWindow] = []
        self._open: IterationWindow | None = None
        self._epoch = 0
        self._passes: dict[int | None, int] = {}  # passes begun per loader (its dataset): Note [Epochs per loader]
        self._open_passes: set[int | None] = set()
        self._last_activity_s = 0.0
        # compute-engine seconds by where their duration came from (work.args["timing"]: "calibrated" to a measured
        # profile, "predicted" by the cost model, ...), over the whole run
        self.compute_s_by_timing: dict[str, float] = {}
        self._lock = threading.RLock()
        self._sources: weakref.WeakSet[Any] = weakref.WeakSet()  # loader iterators fetched from so far
        self._removers: list[Any] = []
        self.attach()

    # -- devices ---------------------------------------------------------------------------------------------------
    def attach(self) -> None:
        """Start logging every device the provider knows and that is not logged yet."""
        for dev in self._devices_provider():
            if any(dev is d for d in self.devices):
                continue
            self.devices.append(dev)
            self._hook(dev)

    def _hook(self, dev: EmulatedGPU) -> None:
        # See Note [Iterations].
        self._removers.append(dev.add_listener(_DeviceLog(self, dev.index)))

    def detach(self) -> None:
        """Stop logging every attached device."""
        for remove in self._removers:
            remove()
        self._removers.clear()

    def _sync_wait_total(self) -> float:
        return sum(sum(d.stats.host_wait_s.values()) for d in self.devices)

    def _h2d_bytes_total(self) -> int:
        return sum(d.stats.h2d_bytes for d in self.devices)

    # -- iteration marks -------------------------------------------------------------------------------------------
    def sync_wait_total(self) -> float:
        """Return the seconds the host has spent blocked on the devices so far (every device, every kind)."""
        return self._sync_wait_total()

    def on_fetch(self, start_s: float, end_s: float, source: Any = None, sync_wait_before_s: float | None = None) -> None:
        """Record a successful batch fetch: it ends the open iteration and starts a new one at `start_s`; `source`
        (the loader iterator) tells a loader starting (Note [The last training step]); `sync_wait_before_s`, the
        sync_wait_total() read when the fetch began, moves GPU waits inside it out of the data wait (Note [GPU waits
        inside a fetch])."""
        with self._lock:
            self.attach()
            sync_now = self._sync_wait_total()
            fetch_sync = 0.0 if sync_wait_before_s is None else max(0.0, sync_now - sync_wait_before_s)
            loader = _loader_key(source)  # See Note [Epochs per loader]
            if loader not in self._open_passes:
                self._open_passes.add(loader)
                self._passes[loader] = self._passes.get(loader, 0) + 1
            self._epoch = self._passes[loader]
            if source is not None and source not in self._sources:
                self._sources.add(source)
                win = self._open
                if win is not None and win.step_mark is not None:
                    self._close_at_step(win.step_mark, start_s)
            self._close(start_s, sync_total=sync_now - fetch_sync)
            last = self.iterations[-1] if self.iterations else None
            if last is not None and last.end_s is not None and last.end_s > start_s:
                last.end_s = start_s
            win = self._new_window(start_s)
            win.fetches.append((start_s, end_s))
            win.fetch_sync_s = fetch_sync
            win.sync_wait_start_s -= fetch_sync  # the wait belongs to this iteration, as its fetch does
            self.iterations.append(win)
            self._open = win
            if self.trace is not None:
                self.trace.host_span("data wait", start_s, end_s, category="data", iteration=win.index)

    def on_exhausted(self, start_s: float, source: Any = None) -> None:
        """Record a fetch that raised StopIteration: close the open iteration, open none (end of the epoch of
        `source`'s loader, or of every loader when it is not given)."""
        with self._lock:
            # The last iteration ends when the GPU finishes what it launched (see Note [Iterations]); a next epoch
            # that starts fetching before then cuts it at its first fetch.
            gpu_done = max((d.t_done for d in self.devices), default=0.0)
            closing = self._open
            self._close(max(start_s, gpu_done))
            if source is None:
                self._open_passes.clear()
            else:
                self._open_passes.discard(_loader_key(source))
            if closing is not None and not closing.tail:  # See Note [Prefetching loaders]
                self._open = self._new_window(start_s, tail=True)

    def _new_window(self, start_s: float, tail: bool = False) -> IterationWindow:
        """Return a window of the current epoch starting at `start_s`, its start counters read now."""
        win = IterationWindow(len(self.iterations), self._epoch, start_s, tail=tail)
        win.sync_wait_start_s = self._sync_wait_total()
        win.h2d_bytes_start = self._h2d_bytes_total()
        if self.emulator_meter is not None:
            win.emulator_start = self.emulator_meter()
        if self.recordings_meter is not None:
            win.recorded_start = self.recordings_meter()
        if self.calls_meter is not None:
            win.calls_start = self.calls_meter()
        return win

    def note_training(self) -> None:
        """Record that a backward pass or an optimizer step ran in the open iteration (it is a training step), and
        mark where it ended (Note [The last training step])."""
        win = self._open
        if win is not None:
            win.trained = True
            win.step_mark = StepMark(
                self.now(), max((d.t_done for d in self.devices), default=0.0), self._sync_wait_total(),
                self._h2d_bytes_total(), self.emulator_meter() if self.emulator_meter is not None else (0.0, 0),
                self.recordings_meter() if self.recordings_meter is not None else 0,
                self.calls_meter() if self.calls_meter is not None else -1, dict(win.launched_s))

    def _close_at_step(self, mark: StepMark, next_start_s: float) -> None:
        """Close the open window at its last training step (Note [The last training step]): the span after it,
        up to `next_start_s`, and the compute launched in it are kept on the window."""
        win = self._open
        assert win is not None
        end_s = min(max(mark.host_s, mark.gpu_done_s, win.start_s), next_start_s)
        after_work_s = _compute_launched_s(win) - sum(v for (_, e), v in mark.launched_s.items() if e == "compute")
        self._close(end_s)
        if win.end_s is None or self._open is win:  # a tail window that ran nothing: dropped by _close
            return
        win.after_step_s = max(0.0, next_start_s - win.end_s)
        win.after_step_gpu_work_s = max(0.0, after_work_s)
        win.launched_s = dict(mark.launched_s)
        win.sync_wait_end_s, win.h2d_bytes_end = mark.sync_wait_s, mark.h2d_bytes
        if self.emulator_meter is not None:
            win.emulator_end = mark.emulator
        if self.recordings_meter is not None:
            win.recorded_end = mark.recorded
        if self.calls_meter is not None:
            win.calls_end = mark.calls

    def mark_iteration(self, data_wait_s: float = 0.0) -> None:
        """Start a new iteration now (for loops without a DataLoader); `data_wait_s` = host time spent getting data."""
        now = self.now()
        self.on_fetch(now - data_wait_s, now)

    def drop_iterations(self, start_index: int) -> None:
        """Forget the iterations from `start_index` on (their boundaries proved wrong); none is left open."""
        with self._lock:
            del self.iterations[start_index:]
            self._open = None

    def _close(self, end_s: float, partial: bool = False, sync_total: float | None = None) -> None:
        win = self._open
        if win is None:
            return
        if win.tail:  # See Note [Prefetching loaders]
            if not win.trained and _compute_launched_s(win) < TAIL_MIN_COMPUTE_S:
                self._open = None  # idle: no iteration, and the one before it keeps its end
                return
            prev = self.iterations[-1] if self.iterations else None
            if prev is not None and prev.end_s is not None and prev.end_s > win.start_s:
                prev.end_s = win.start_s  # the tail's work follows it: the two windows must not overlap
            win.index = len(self.iterations)
            self.iterations.append(win)
        win.end_s = max(win.start_s, end_s)
        win.partial = partial
        win.sync_wait_end_s = self._sync_wait_total() if sync_total is None else sync_total
        win.h2d_bytes_end = self._h2d_bytes_total()
        if self.emulator_meter is not None:
            win.emulator_end = self.emulator_meter()
        if self.recordings_meter is not None:
            win.recorded_end = self.recordings_meter()
        if self.calls_meter is not None:
            win.calls_end = self.calls_meter()
        self._open = None
        if self.trace is not None:
            self.trace.host_span(f"iteration {win.index}", win.start_s, win.end_s, category="iteration")

    def finish(self) -> None:
        """Close the iteration still open at the end of the run (flagged partial). See Note [Iterations]."""
        with self._lock:
            win = self._open
            if win is None:
                return
            gpu_done = max((d.t_done for d in self.devices), default=0.0)
            if win.tail:  # the last batch a prefetching loader yields after its loader ran out
                self._close(max(self._last_activity_s, min(gpu_done, self.now()), win.start_s), partial=True)
                return
            prev = self.iterations[-2] if len(self.iterations) >= 2 else None
            if (prev is not None and prev.end_s == win.start_s and _compute_launched_s(win) == 0.0
                    and _compute_launched_s(prev) > 0.0):
                # the loop fetched a batch and stopped (`if i >= iters: break`): no iteration; the one before it
                # ends when the GPU finishes its work, as at the end of an epoch
                self.iterations.pop()
                self._open = None
                prev.end_s = max(prev.end_s, min(gpu_done, self.now()))
                return
            end_s = max(self._last_activity_s, min(gpu_done, self.now()) if gpu_done > win.start_s else 0.0)
            if end_s <= win.start_s:
                end_s = self.now()
            self._close(end_s, partial=True)


def _compute_launched_s(win: IterationWindow) -> float:
    """Return the compute-engine seconds launched in an iteration, over all devices."""
    return sum(v for (_, engine), v in win.launched_s.items() if engine == "compute")


class _DeviceLog:
    """DeviceListener that feeds one device's work into a RunCollector's engine logs."""

    def __init__(self, collector: RunCollector, index: int) -> None:
        self.collector = collector
        self.index = index

    def on_work(self, work: Any) -> None:
        """Log the work item's busy interval on its engine."""
        col = self.collector
        log = col.logs.get((self.index, work.engine))
        if log is None:
            log = col.logs[(self.index, work.engine)] = EngineLog()
        log.add(work.start_s, work.end_s)
        duration_s = work.end_s - work.start_s
        if work.engine == "compute":
            timing = str(work.args.get("timing", "predicted"))
            col.compute_s_by_timing[timing] = col.compute_s_by_timing.get(timing, 0.0) + duration_s
        win = col._open  # read once, without the lock: see Note [Iterations]
        if win is not None:
            key = (self.index, work.engine)
            win.launched_s[key] = win.launched_s.get(key, 0.0) + duration_s
        col._last_activity_s = max(col._last_activity_s, work.launch_s)

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        """Note host activity at the end of a wait."""
        self.collector._last_activity_s = max(self.collector._last_activity_s, end_s)


# Note [Epochs per loader]: an iteration's `epoch` was the number of loader passes begun so far in the process, so a
# training loop that validates after every few steps counted each validation pass as an epoch (milesial's
# Pytorch-UNet, one epoch of 36 images with validation every step, reported epochs 1 to 18; session 15). Each loader
# (keyed by its dataset: a DataLoader's iterators share it across passes) now counts its own passes: training
# iterations carry the training loader's epoch, validation iterations their loader's pass number. Iterations marked
# without a loader (mark_iteration, tests) share one count, as before.
def _loader_key(source: Any) -> int | None:
    """Return the key of the loader an iterator belongs to (its dataset's id), or None for no iterator."""
    if source is None:
        return None
    return id(getattr(source, "_dataset", source))
