"""The installed emulation: its devices, the per-thread current device and stream, and the value hook."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpemu.device import EmulatedGPU, Stream, TraceRecorder
from gpemu.errors import GpemuError

# A value hook gets (tensor_shape, dtype, reason) and returns a value for `.item()` / `.cpu()` (a number, a list,
# a numpy array or a CPU tensor of that shape), or None to fall back to zeros. See docs/drop-in.md.
ValueHook = Callable[[tuple[int, ...], Any, str], Any]


@dataclass
class Emulation:
    """Everything `install()` set up: the emulated GPUs (stats, trace, allocator) and run-time settings."""

    devices: list[EmulatedGPU]
    trace: TraceRecorder | None = None
    model: str | None = None
    value_hook: ValueHook | None = None
    nonzero_fraction: float = 1.0  # See Note [Data-dependent shapes] in ops.py
    float_value: float = 0.0  # what computed floating-point values read back as; See Note [Reading computed values]
    autocast_seen: bool = False  # set once torch.autocast("cuda") is entered; enables dtype emulation
    cublas_workspace: bool = True  # the first GEMM of a thread and stream allocates cuBLAS's workspace (Note [cuBLAS
    # workspace in the drop-in] in tensor.py); off for simulations of a torch that predates it
    _local: threading.local = field(default_factory=threading.local, repr=False)
    phases: Any = None  # gpemu.torch_backend.phases.PhaseTracker, set by install()
    replay: Any = None  # gpemu.torch_backend.replay.Replayer, or None when replay is disabled
    # autocast's low-precision input copies held on the device: key -> (device index, allocator handle). See Note
    # [Autocast casts take memory] in autocast.py.
    autocast_casts: dict[Any, tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def gpu_key(self) -> str:
        """Return the catalog key of the emulated GPUs."""
        return self.devices[0].spec.key

    def autocast_stack(self) -> list[Any]:
        """Return this thread's stack of active torch.autocast("cuda") dtypes (None = disabled)."""
        stack: list[Any] | None = getattr(self._local, "autocast", None)
        if stack is None:
            stack = self._local.autocast = []
        return stack

    def autocast_dtype(self) -> Any:
        """Return the active CUDA autocast dtype on this thread, or None."""
        stack = getattr(self._local, "autocast", None)
        return stack[-1] if stack else None

    def current_device(self) -> int:
        """Return this thread's current device index (torch.cuda.current_device)."""
        return getattr(self._local, "device", 0)

    def set_device(self, index: int) -> None:
        """Set this thread's current device (torch.cuda.set_device)."""
        self.check_index(index)
        self._local.device = index

    def check_index(self, index: int) -> int:
        """Return `index` if it names an emulated device; raise the error CUDA would otherwise."""
        if not 0 <= index < len(self.devices):
            raise GpemuError(
                f"invalid device ordinal cuda:{index}: gpemu emulates {len(self.devices)} GPU(s) "
                f"(cuda:0..cuda:{len(self.devices) - 1}); pass --count / count= to emulate more"
            )
        return index

    def current_stream(self, index: int | None = None) -> Stream:
        """Return this thread's current stream on device `index` (default: the current device)."""
        index = self.current_device() if index is None else index
        streams: dict[int, Stream] | None = getattr(self._local, "streams", None)
        if streams is None:
            return self.devices[index].default_stream
        return streams.get(index) or self.devices[index].default_stream

    def set_stream(self, stream: Stream) -> None:
        """Make `stream` current on its device for this thread."""
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        streams[stream.device.index] = stream


_current: Emulation | None = None


def current_emulation() -> Emulation | None:
    """Return the installed Emulation, or None when gpemu is not installed."""
    return _current


def require() -> Emulation:
    """Return the installed Emulation or raise a clear error."""
    if _current is None:
        raise GpemuError("an emulated CUDA tensor was used after gpemu.torch_backend.uninstall()")
    return _current


def _set_current(emu: Emulation | None) -> None:
    global _current
    _current = emu
