"""Where the profiler runs: a real CUDA device (CUDA events, allocator stats) or the CPU for a dry run.

Both targets expose the same small surface, so the measurement loops (gpemu.profiler.measure) are one code path.
See Note [Dry-run target].
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

# Note [Dry-run target]
# A dry run executes the real model, loss, backward and optimizer on the CPU. Its "timings" are host wall time of
# those real ops (perf_counter marks; CPU ops are synchronous), its memory figures come from a simple tracker
# (parameters + gradients + optimizer state + the bytes of every module output of the forward pass) and it can be
# given a fake memory limit so the OOM path is exercised. Rows from a dry run are labelled measured=0 with
# "dry-run" in their source: they test the profiler's logic and output schema, never a GPU.

MiB = 1024**2


def is_oom(exc: BaseException) -> bool:
    """Return True when `exc` is a device out-of-memory error (torch's, or cuDNN/cuBLAS allocation failures)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text or "CUDNN_STATUS_ALLOC_FAILED" in text
    )


class Target(Protocol):
    """The device-facing surface the measurement loops use."""

    device: torch.device
    dry_run: bool

    def mark(self) -> Any:
        """Record a timing mark on the device's current stream; return a handle."""

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Return seconds between two marks (call after synchronize)."""

    def synchronize(self) -> None:
        """Wait for all queued device work."""

    def autocast(self, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
        """Return an autocast context for this device type and dtype."""

    def grad_scaler(self) -> Any | None:
        """Return a GradScaler for fp16 AMP, or None where the target does not need one."""

    def host_buffer(self, size_bytes: int, pinned: bool) -> torch.Tensor:
        """Return a uint8 host tensor of `size_bytes`, page-locked when `pinned` (and supported)."""

    def watch(self, model: nn.Module, optimizer_state_bytes: int) -> None:
        """Start tracking memory for `model` (dry run only; a no-op on CUDA)."""

    def unwatch(self) -> None:
        """Stop tracking memory."""

    def reset_peak(self) -> None:
        """Reset the peak-memory counters."""

    def memory_mib(self) -> dict[str, float]:
        """Return {"allocated", "peak", "reserved"} in MiB since the last reset_peak."""

    def empty_cache(self) -> None:
        """Free cached device memory."""


class CudaTarget:
    """A real CUDA device: CUDA events for timing, torch.cuda allocator statistics for memory."""

    dry_run = False

    def __init__(self, index: int = 0) -> None:
        if not torch.cuda.is_available():
            from gpemu.errors import GpemuError

            raise GpemuError("no CUDA device is available; use --dry-run to exercise the profiler on the CPU")
        if index >= torch.cuda.device_count():
            from gpemu.errors import GpemuError

            raise GpemuError(f"--gpu-index {index}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)

    def mark(self) -> torch.cuda.Event:
        """Record a CUDA event on the current stream; return it."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_s(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        """Return seconds between two recorded CUDA events."""
        return float(start.elapsed_time(end)) / 1e3

    def synchronize(self) -> None:
        """torch.cuda.synchronize on this device."""
        torch.cuda.synchronize(self.device)

    def autocast(self, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
        """Return torch.autocast("cuda", dtype)."""
        return torch.autocast("cuda", dtype=dtype)

    def grad_scaler(self) -> Any | None:
        """Return a CUDA GradScaler."""
        return torch.amp.GradScaler("cuda")

    def host_buffer(self, size_bytes: int, pinned: bool) -> torch.Tensor:
        """Return a host uint8 tensor (pinned or pageable), touched so its pages exist."""
        buf = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=pinned)
        buf.fill_(1)
        return buf

    def watch(self, model: nn.Module, optimizer_state_bytes: int) -> None:
        """No-op: the CUDA caching allocator already counts everything."""

    def unwatch(self) -> None:
        """No-op."""

    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats."""
        torch.cuda.reset_peak_memory_stats(self.device)

    def memory_mib(self) -> dict[str, float]:
        """Return allocated, peak allocated and peak reserved MiB from the caching allocator."""
        return {
            "allocated": torch.cuda.memory_allocated(self.device) / MiB,
            "peak": torch.cuda.max_memory_allocated(self.device) / MiB,
            "reserved": torch.cuda.max_memory_reserved(self.device) / MiB,
        }

    def empty_cache(self) -> None:
        """Release cached blocks (after an OOM, between models)."""
        import gc

        gc.collect()
        torch.cuda.empty_cache()


class DryRunTarget:
    """The CPU standing in for a GPU: wall-clock marks and a simple memory tracker. See Note [Dry-run target]."""

    dry_run = True

    def __init__(self, memory_limit_mib: float | None = None) -> None:
        self.device = torch.device("cpu")
        self.memory_limit_mib = memory_limit_mib
        self._persistent_bytes = 0
        self._activation_bytes = 0
        self._peak_bytes = 0
        self._hooks: list[Any] = []

    def mark(self) -> float:
        """Return the host clock (CPU ops are synchronous)."""
        return time.perf_counter()

    def elapsed_s(self, start: float, end: float) -> float:
        """Return end - start seconds."""
        return end - start

    def synchronize(self) -> None:
        """No-op on the CPU."""

    def autocast(self, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
        """Return CPU autocast (bfloat16: CPU autocast's well-supported dtype)."""
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def grad_scaler(self) -> Any | None:
        """Return None: bf16 autocast on the CPU needs no loss scaling."""
        return None

    def host_buffer(self, size_bytes: int, pinned: bool) -> torch.Tensor:
        """Return a plain host tensor (pinning needs a CUDA driver)."""
        buf = torch.empty(size_bytes, dtype=torch.uint8)
        buf.fill_(1)
        return buf

    def watch(self, model: nn.Module, optimizer_state_bytes: int) -> None:
        """Track parameters, gradients, optimizer state and forward activations of `model`."""
        self.unwatch()
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
        # parameters + gradients + buffers + optimizer state (momentum) stay resident between iterations
        self._persistent_bytes = 2 * param_bytes + buffer_bytes + optimizer_state_bytes
        self._activation_bytes = 0
        self._peak_bytes = self._persistent_bytes

        def pre_hook(module: nn.Module, args: Any) -> None:
            if module is model:
                self._activation_bytes = 0

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if list(module.children()):
                return  # count leaf modules only
            self._activation_bytes += sum(
                t.numel() * t.element_size() for t in _tensors(output) if t.requires_grad or t.grad_fn is not None
            )
            now = self._persistent_bytes + self._activation_bytes
            self._peak_bytes = max(self._peak_bytes, now)
            if self.memory_limit_mib is not None and now > self.memory_limit_mib * MiB:
                raise torch.OutOfMemoryError(
                    f"dry-run: tried to hold {now / MiB:.1f} MiB, over the fake limit of {self.memory_limit_mib} MiB"
                )

        self._hooks = [model.register_forward_pre_hook(pre_hook)]
        self._hooks += [m.register_forward_hook(hook) for m in model.modules()]

    def unwatch(self) -> None:
        """Remove the tracking hooks."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def reset_peak(self) -> None:
        """Reset the tracked peak to the resident bytes."""
        self._peak_bytes = self._persistent_bytes

    def memory_mib(self) -> dict[str, float]:
        """Return tracked resident, peak and (= peak, no caching allocator) reserved MiB."""
        return {
            "allocated": self._persistent_bytes / MiB,
            "peak": self._peak_bytes / MiB,
            "reserved": self._peak_bytes / MiB,
        }

    def empty_cache(self) -> None:
        """Forget activations (after a fake OOM)."""
        self._activation_bytes = 0


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def make_target(dry_run: bool, gpu_index: int = 0, memory_limit_mib: float | None = None) -> Target:
    """Return the CUDA target for `gpu_index`, or the CPU dry-run target."""
    if dry_run:
        return DryRunTarget(memory_limit_mib)
    return CudaTarget(gpu_index)
