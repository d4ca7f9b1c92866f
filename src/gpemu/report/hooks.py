"""Report installation: the DataLoader fetch timer, the end-of-run print and the atomic JSON writer."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpemu.device.gpu import EmulatedGPU
from gpemu.report.collector import RunCollector
from gpemu.report.summary import render, report_dict, write_json

# While a run is longer than this, the JSON file is rewritten (atomically) at most this often, so a killed run
# keeps its results up to the last few seconds.
FLUSH_INTERVAL_S = 5.0

_tls = threading.local()


def _torch_backend_devices() -> list[EmulatedGPU]:
    try:
        from gpemu.torch_backend import current_emulation  # type: ignore[attr-defined]
    except ImportError:
        return []
    emulation = current_emulation()
    return list(emulation.devices) if emulation is not None else []


def _torch_backend_meter() -> Callable[[], tuple[float, int]] | None:
    """Return the drop-in backend's emulator host-time meter when an emulation is installed, else None."""
    try:
        from gpemu.torch_backend import current_emulation  # type: ignore[attr-defined]
        from gpemu.torch_backend.tensor import emulator_host_time
    except ImportError:
        return None
    return emulator_host_time if current_emulation() is not None else None


def _torch_backend_counter(part: str, counter: str) -> Callable[[], int] | None:
    """Return a meter reading `counter` of the installed emulation's `part` (its replayer, its phase tracker), or
    None without an emulation or that part."""
    try:
        from gpemu.torch_backend import current_emulation  # type: ignore[attr-defined]
    except ImportError:
        return None
    emu = current_emulation()
    owner = getattr(emu, part, None) if emu is not None else None
    if owner is None:
        return None
    return lambda: int(getattr(owner, counter))


def _torch_backend_recordings() -> Callable[[], int] | None:
    """Return a meter of the calls the drop-in backend's replay path recorded per op, when it replays, else None."""
    return _torch_backend_counter("replay", "warming")  # Note [Forwards that never replay] in replay.py


def _torch_backend_module_calls() -> Callable[[], int] | None:
    """Return a meter of module calls outside a top module's forward, when an emulation is installed, else None."""
    return _torch_backend_counter("phases", "module_calls")


# Note [Iteration boundaries]
# An iteration ends at each DataLoader fetch (the loader's wait is then measured). Loops without a DataLoader
# (nanoGPT-style, in-memory batches) end one at each optimizer.step(). Loops with neither (pytorch/examples
# word_language_model updates parameters by hand) end one at each backward pass from the second on: the first
# backward may be followed by an optimizer step we have not seen yet, and a step, once seen, takes over. With
# gradient accumulation and an optimizer, iterations are optimizer steps: the first step comes after several backward
# passes (nanoGPT: gradient_accumulation_steps of them), whose boundaries were micro-steps, so the first step drops
# the iterations they opened before it marks its own.
# Note [Several optimizers per step]: a loop with one optimizer per sub-network (pytorch/tutorials
# seq2seq_translation_tutorial: `encoder_optimizer.step(); decoder_optimizer.step()` after one backward) made two
# iterations of each step, the second holding nothing but the decoder's update: the report's medians (GPU 0.01 ms
# launched per iteration against a 2.5 ms mean) and its iteration count (2x) were wrong. A step that follows another
# step with no backward pass between them (once backward passes have been seen) belongs to the same iteration. A
# GAN without a DataLoader (backward, D step, backward, G step) still counts two.
# Note [Optimizer steps in backward]: optimizers can run inside the backward pass, one per parameter, from
# `Tensor.register_post_accumulate_grad_hook` (pytorch/tutorials optimizer_step_in_backward_tutorial, which saves the
# gradients' memory this way). Each of those steps ended an iteration, so a ViT-L/16 step counted as ~290 iterations
# of a few parameters each. A step taken while the autograd engine runs a graph task is part of that backward
# pass: the backward pass that ran optimizer steps ends one iteration when it returns, as a step after it would
# (a reentrant backward nested in it, as activation checkpointing runs, does not).


class RunReport:
    """A live run report: a collector plus the DataLoader patch, JSON flushing and the exit print."""

    def __init__(
        self,
        devices: Callable[[], list[EmulatedGPU]] | list[EmulatedGPU] | None = None,
        json_path: str | Path | None = None,
        warmup: int = 1,
        print_summary: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        trace: Any = None,
        meta: dict[str, Any] | None = None,
        emulator_meter: Callable[[], tuple[float, int]] | None = None,
    ) -> None:
        self.collector = RunCollector(devices if devices is not None else _torch_backend_devices, clock, trace,
                                      emulator_meter if emulator_meter is not None else _torch_backend_meter(),
                                      _torch_backend_recordings() if emulator_meter is None else None,
                                      _torch_backend_module_calls() if emulator_meter is None else None)
        self.json_path = Path(json_path) if json_path else None
        self.warmup = warmup
        self.print_summary = print_summary
        self.meta = dict(meta or {})
        self._last_flush_s = time.monotonic()
        self._finished = False
        self._original_next: Any = None
        self.memory: Any = None  # a gpemu.report.memory.MemoryReport when --memory-report is on
        self._saw_fetch = False
        self._step_hook: Any = None
        self._original_backward: Any = None
        self._steps_seen = 0
        self._steps_in_backward = 0  # optimizer steps taken inside the running backward pass
        self._backwards_seen = 0
        self._backwards_at_step = 0  # _backwards_seen at the last step boundary: Note [Several optimizers per step]
        self._first_backward_iteration: int | None = None  # index of the first iteration a backward pass opened

    # -- DataLoader patch -------------------------------------------------------------------------------------------
    def patch_dataloader(self) -> None:
        """Time every DataLoader batch fetch (torch.utils.data _BaseDataLoaderIter.__next__) in this process."""
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        if self._original_next is not None:
            return
        original = self._original_next = cls.__next__
        report = self

        def __next__(it: Any) -> Any:
            if getattr(_tls, "inside", False):  # a loader nested in a loader: only the outer fetch counts
                return original(it)
            _tls.inside = True
            report._saw_fetch = True
            if report.memory is not None:
                report.memory.on_step_boundary()
            t0 = report.collector.now()
            waited0 = report.collector.sync_wait_total()  # Note [GPU waits inside a fetch] in collector.py
            try:
                batch = original(it)
            except StopIteration:
                report.collector.on_exhausted(t0, it)
                raise
            finally:
                _tls.inside = False
            report.collector.on_fetch(t0, report.collector.now(), it, waited0)
            report._maybe_flush()
            return batch

        cls.__next__ = __next__  # type: ignore[method-assign,assignment]

    def patch_optimizer(self) -> None:
        """For loops without a DataLoader: each optimizer step ends an iteration (data wait unknown, counted as 0);
        for loops with neither a DataLoader nor an optimizer (manual `p.data.add_(p.grad)` updates), each
        backward pass after the first does; a backward pass that ran optimizer steps counts as one step. See Note
        [Iteration boundaries] and Note [Optimizer steps in backward]."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        report = self

        def _boundary() -> None:
            if report.memory is not None:
                report.memory.on_step_boundary()
            report.collector.mark_iteration(0.0)
            report._maybe_flush()

        def _step_boundary() -> None:
            report._steps_seen += 1
            report.collector.note_training()
            if report._backwards_seen and report._backwards_seen == report._backwards_at_step:
                return  # no backward since the last step: the same iteration (Note [Several optimizers per step])
            report._backwards_at_step = report._backwards_seen
            if not report._saw_fetch:
                if report._steps_seen == 1 and report._first_backward_iteration is not None:
                    report.collector.drop_iterations(report._first_backward_iteration)
                _boundary()

        def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            if torch._C._current_graph_task_id() != -1:  # See Note [Optimizer steps in backward]
                report._steps_in_backward += 1
                report.collector.note_training()
                return
            _step_boundary()

        if self._step_hook is None:
            self._step_hook = register_optimizer_step_post_hook(_after_step)
        if self._original_backward is None:
            original = self._original_backward = torch.autograd.backward

            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                report._backwards_seen += 1
                report.collector.note_training()
                if report._steps_in_backward and torch._C._current_graph_task_id() == -1:
                    report._steps_in_backward = 0  # optimizer steps ran inside it: Note [Optimizer steps in backward]
                    _step_boundary()
                elif not report._saw_fetch and report._steps_seen == 0 and report._backwards_seen >= 2:
                    if report._first_backward_iteration is None:
                        report._first_backward_iteration = len(report.collector.iterations)
                    _boundary()
                return out

            torch.autograd.backward = backward

    def unpatch_optimizer(self) -> None:
        """Remove the optimizer-step hook and the backward wrapper."""
        import torch

        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        if self._original_backward is not None:
            torch.autograd.backward = self._original_backward
            self._original_backward = None

    def unpatch_dataloader(self) -> None:
        """Restore the original DataLoader __next__."""
        if self._original_next is not None:
            from torch.utils.data import dataloader

            dataloader._BaseDataLoaderIter.__next__ = self._original_next  # type: ignore[method-assign]
            self._original_next = None

    # -- output -------------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return the report as it stands (every closed iteration plus the summary)."""
        return report_dict(self.collector, self.warmup, {**self.meta, "timing": _timing_sources()})

    def _maybe_flush(self) -> None:
        if self.json_path is None or time.monotonic() - self._last_flush_s < FLUSH_INTERVAL_S:
            return
        t0 = time.monotonic()
        write_json({**self.to_dict(), "complete": False}, self.json_path)
        # Keep flushing cheap for very long runs: never spend more than ~5% of the time writing.
        self._last_flush_s = time.monotonic() + 20 * (time.monotonic() - t0)

    def finish(self, print_summary: bool | None = None) -> dict[str, Any]:
        """Close the open iteration, write the JSON (if asked) and print the summary; return the report."""
        if self._finished:
            return self.to_dict()
        self._finished = True
        self.collector.finish()
        report = self.to_dict()
        if self.memory is not None:
            report["memory"] = self.memory.to_dict()
            self.memory.close()
        idle_process = not self.collector.iterations and not self.collector.logs  # e.g. torchrun's launcher
        # an idle process (a launcher exiting after its worker) must not overwrite the worker's report
        if self.json_path is not None and not (idle_process and Path(self.json_path).exists()):
            write_json({**report, "complete": True}, self.json_path)
        if (self.print_summary if print_summary is None else print_summary) and not idle_process:
            render(report)
            if self.memory is not None:
                self.memory.render()
            if self.json_path is not None:
                print(f"gpemu: report written to {self.json_path}", file=sys.stderr)
        return report


_active: RunReport | None = None


def active_report() -> RunReport | None:
    """Return the report installed in this process, if any."""
    return _active


def install_report(
    devices: Callable[[], list[EmulatedGPU]] | list[EmulatedGPU] | None = None,
    json_path: str | Path | None = None,
    warmup: int = 1,
    print_summary: bool = True,
    trace: Any = None,
    meta: dict[str, Any] | None = None,
) -> RunReport:
    """Install the process-wide run report: time DataLoader fetches, print/write at exit (also on Ctrl-C/SIGTERM)."""
    global _active
    if _active is not None:
        return _active
    report = _active = RunReport(devices, json_path, warmup, print_summary, trace=trace, meta=meta)
    report.patch_dataloader()
    report.patch_optimizer()
    atexit.register(report.finish)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:

        def _on_term(signum: int, frame: Any) -> None:
            report.finish()
            _write_trace_on_term(trace)  # See Note [Trace on SIGTERM]
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, _on_term)
    return report


# Note [Trace on SIGTERM]: a run stopped by SIGTERM (`timeout 300 gpemu run ...`, Note [Signals to the child] in
# run_cmd.py) ends as SIGTERM ends a plain python run: no atexit handlers. The handler above writes the run report
# first, but `--trace` is written by an atexit handler (emulation.py), so a signal-stopped run lost its trace.
# yenchenlin/nerf-pytorch's run_nerf.py fixes N_iters = 200,001 in the file, so a short run is one stopped by a
# signal, and `--trace` came back empty. The handler now writes the trace too (once: the process then dies by
# SIGTERM, and the atexit writer never runs).
def _write_trace_on_term(trace: Any) -> None:
    path = os.environ.get("GPEMU_TRACE")
    if trace is None or not path:
        return
    from gpemu.torch_backend.emulation import write_trace_unless_idle

    write_trace_unless_idle(trace, path)


def _timing_sources() -> dict[str, Any]:
    """Return what the drop-in emulation calibrated to (profiles by workload/batch/dtype/phase) and its cost model."""
    try:
        from gpemu.torch_backend import current_emulation  # type: ignore[attr-defined]
    except ImportError:
        return {}
    emulation = current_emulation()
    if emulation is None or getattr(emulation, "phases", None) is None:
        return {}
    described = emulation.phases.describe()
    out: dict[str, Any] = {"workloads": described["workloads"], "profiles": described["calibrated"],
                           "phase_predictions": described.get("phase_predicted", {}),
                           "compiled": described.get("compiled", [])}
    with contextlib.suppress(Exception):  # See Note [Expected error] in gpemu/cost/expected_error.py
        from gpemu.cost.expected_error import expected_error, seen_models
        from gpemu.profiles.step import workload_kind

        for label, entry in out["phase_predictions"].items():
            parts = label.split("/")  # workload/batch/dtype[/channels_last]/phase
            err = expected_error(str(entry[1]), "predicted", parts[-1], parts[2], workload_kind(parts[0]),
                                 parts[0] in seen_models())
            out["phase_predictions"][label] = [*entry, err.short() if err is not None else None]
    with contextlib.suppress(Exception):  # a report must never fail on its provenance line
        from gpemu.cost import load_params

        spec = emulation.devices[0].spec
        source = load_params().factor_source(spec)
        how = ("its own fitted efficiency factors" if source == spec.key else
               f"efficiency factors borrowed from {source}" if source else "unfitted efficiency factors")
        out["cost_model"] = f"the cost model ({spec.key} spec, {how}; docs/cost-model.md)"
    with contextlib.suppress(Exception):  # See Note [Published bias per GPU] in gpemu/cost/expected_error.py
        from gpemu.cost.expected_error import published_biases

        out["published_bias"] = [b.to_json() for b in published_biases(emulation.devices[0].spec.key)]
    return out


def _real_gpu_name() -> str:
    """Return the machine's own GPU name, or "(no CUDA GPU)"."""
    try:
        import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "(no CUDA GPU)"
    except Exception:  # a broken driver must not stop the script
        return "(no CUDA GPU)"


def install_report_from_env() -> RunReport:
    """Install the report for `gpemu run`: devices from the torch backend, JSON path from GPEMU_REPORT_JSON."""
    trace, model = None, os.environ.get("GPEMU_MODEL") or None
    with contextlib.suppress(ImportError, AttributeError):
        from gpemu.torch_backend import current_emulation  # type: ignore[attr-defined]

        emulation = current_emulation()
        trace = getattr(emulation, "trace", None)
        model = model or getattr(emulation, "model", None)
    meta: dict[str, Any] = {"model": model}
    if os.environ.get("GPEMU_GPU") == "real":  # see `gpemu run --gpu real`: nothing is emulated
        meta["gpu"] = f"real {_real_gpu_name()}"
        meta["device_count"] = 1
    report = install_report(json_path=os.environ.get("GPEMU_REPORT_JSON") or None, trace=trace, meta=meta)
    if os.environ.get("GPEMU_MEMORY_REPORT") == "1":
        from gpemu.report.memory import MemoryReport

        report.memory = MemoryReport(_torch_backend_devices())
    return report


@contextlib.contextmanager
def reporting(
    devices: list[EmulatedGPU], json_path: str | Path | None = None, warmup: int = 1, print_summary: bool = False
) -> Iterator[RunReport]:
    """Time DataLoader fetches against `devices` inside the block only (no exit hook); yields the RunReport."""
    report = RunReport(devices, json_path, warmup, print_summary)
    report.patch_dataloader()
    try:
        yield report
    finally:
        report.unpatch_dataloader()
        report.finish()
