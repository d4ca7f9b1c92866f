"""Emulated torch.cuda API objects: Stream, Event, device properties, device/stream context managers, memory stats."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from gpemu.device import Event as TimelineEvent
from gpemu.device import Stream as TimelineStream
from gpemu.torch_backend import state


def _check_fp32_modes() -> None:
    """Forget op costs priced under other TF32 flags (Note [TF32 flags between ops] in tensor.py)."""
    from gpemu.torch_backend.tensor import check_fp32_modes

    check_fp32_modes()


def device_index(device: Any = None, optional: bool = True) -> int:
    """Return the emulated device index for a torch.cuda-style device argument (None, int, str, torch.device)."""
    emu = state.require()
    if device is None:
        return emu.current_device()
    if isinstance(device, Stream):
        return device.device_index
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type not in ("cuda", "meta"):
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return emu.check_index(device.index) if device.index is not None else emu.current_device()
    return emu.check_index(int(device))


class Stream:
    """torch.cuda.Stream on an emulated GPU (wraps a timeline Stream)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        emu = state.require()
        index = device_index(device)
        self._stream: TimelineStream = kwargs.get("_timeline") or emu.devices[index].new_stream(priority)
        self.device_index = index
        self.priority = priority

    @classmethod
    def _of(cls, timeline: TimelineStream) -> Stream:
        return cls(timeline.device.index, timeline.priority, _timeline=timeline)

    @property
    def device(self) -> torch.device:
        """Return the stream's device."""
        return torch.device("cuda", self.device_index)

    @property
    def cuda_stream(self) -> int:
        """Return a stable integer id (stands in for the cudaStream_t)."""
        return self._stream.stream_id

    @property
    def stream_id(self) -> int:
        """Return the stream id."""
        return self._stream.stream_id

    def query(self) -> bool:
        """Return True when all queued work has finished."""
        return self._stream.query()

    def is_capturing(self) -> bool:
        """Return True while this stream is capturing a CUDA graph (Note [CUDA graphs])."""
        return self._stream.capture is not None

    def synchronize(self) -> None:
        """Block the host until the stream is idle."""
        self._stream.synchronize()
        _check_fp32_modes()

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for `event`."""
        self._stream.wait_event(event._event)

    def wait_stream(self, stream: Stream) -> None:
        """Make later work on this stream wait for all work queued on `stream`."""
        self._stream.wait_stream(stream._stream)

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (or a new one) on this stream and return it."""
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        self._prev = current_stream(self.device_index)
        state.require().set_stream(self._stream)
        return self

    def __exit__(self, *exc: object) -> None:
        state.require().set_stream(self._prev._stream)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._stream is self._stream

    def __hash__(self) -> int:
        return hash((self.device_index, self._stream.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x} (emulated)>"


class Event:
    """torch.cuda.Event on an emulated GPU (elapsed_time in milliseconds of emulated GPU time)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._event = TimelineEvent(enable_timing=enable_timing)
        self.enable_timing = enable_timing

    def record(self, stream: Stream | None = None) -> None:
        """Record the event at the tail of `stream` (default: the current stream)."""
        stream = stream or current_stream()
        self._event.record(stream._stream)

    def wait(self, stream: Stream | None = None) -> None:
        """Make `stream` (default: current) wait for this event."""
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        """Return True when the event has completed."""
        return self._event.query()

    def synchronize(self) -> None:
        """Block the host until the event has completed."""
        self._event.synchronize()
        _check_fp32_modes()

    def elapsed_time(self, end_event: Event) -> float:
        """Return milliseconds between this event and `end_event`."""
        return self._event.elapsed_time(end_event._event)

    def __repr__(self) -> str:
        return "<torch.cuda.Event (emulated)>"


def current_stream(device: Any = None) -> Stream:
    """Return the current emulated stream of `device`."""
    return Stream._of(state.require().current_stream(device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """Return the default emulated stream of `device`."""
    return Stream._of(state.require().devices[device_index(device)].default_stream)


def set_stream(stream: Stream) -> None:
    """Make `stream` current on its device."""
    state.require().set_stream(stream._stream)


class StreamContext:
    """torch.cuda.stream(s): make `s` current inside the block (None: no-op)."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


class DeviceContext:
    """torch.cuda.device(d): make `d` the current device inside the block."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None or (isinstance(device, int) and device < 0) else device_index(device)

    def __enter__(self) -> None:
        emu = state.require()
        self.prev = emu.current_device()
        if self.index >= 0:
            emu.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        state.require().set_device(self.prev)


@dataclass(frozen=True)
class DeviceProperties:
    """What torch.cuda.get_device_properties returns (the fields scripts read)."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    L2_cache_size: int
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    uuid: str = ""
    gcnArchName: str = "NVIDIA CUDA"
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, total_memory="
            f"{self.total_memory // 1024**2}MB, multi_processor_count={self.multi_processor_count}) (emulated)"
        )


# Resident threads per SM by compute capability: CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability" ("Maximum number of resident threads per SM"); 2048 for every capability not listed.
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536}


def max_threads_per_sm(compute_capability: tuple[int, int]) -> int:
    """Return the maximum resident threads per SM of a compute capability (what occupancy calculators read)."""
    return _THREADS_PER_SM.get((int(compute_capability[0]), int(compute_capability[1])), 2048)


def get_device_properties(device: Any = None) -> DeviceProperties:
    """Return the emulated device's properties."""
    gpu = state.require().devices[device_index(device)]
    spec = gpu.spec
    return DeviceProperties(
        name=spec.name,
        major=spec.compute_capability[0],
        minor=spec.compute_capability[1],
        total_memory=gpu.memory_limit_bytes,
        multi_processor_count=spec.sm_count,
        L2_cache_size=int(spec.l2_cache_mib * 1024**2),
        uuid=f"GPU-gpemu-{gpu.index:04d}",
        max_threads_per_multi_processor=max_threads_per_sm(tuple(spec.compute_capability)),  # type: ignore[arg-type]
    )


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """Return torch.cuda.mem_get_info(): (free, total) bytes of the emulated device, counting CUDA contexts."""
    return state.require().devices[device_index(device)].allocator.mem_get_info()


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Return torch.cuda.memory_stats() from the emulated caching allocator (torch's key names)."""
    return state.require().devices[device_index(device)].allocator.memory_stats()


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """Return the torch.cuda.memory_summary() table of the emulated caching allocator."""
    return state.require().devices[device_index(device)].allocator.memory_summary(abbreviated)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Reset the emulated allocator's accumulated (allocated/freed totals) counters."""
    state.require().devices[device_index(device)].allocator.reset_accumulated_memory_stats()


class DeviceOf(DeviceContext):
    """torch.cuda.device_of(t): make the device of tensor `t` current inside the block (a CPU tensor: no-op)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if getattr(obj, "is_cuda", False) else -1)


# device index -> (host time, compute busy seconds) at the previous torch.cuda.utilization() call
_util_samples: dict[int, tuple[float, float]] = {}


def utilization(device: Any = None) -> int:
    """Return the percent of host time since the previous call (or install) the emulated compute engine was busy.

    NVML reports the share of its last sample period (1/6 s to 1 s) during which a kernel ran; gpemu reports the
    compute engine's busy time over the interval since the previous call, capped at 100 (work queued ahead of the host
    counts when it is queued).
    """
    gpu = state.require().devices[device_index(device)]
    now_s, busy_s = gpu.clock.now(), gpu.busy_s("compute")
    prev = _util_samples.get(gpu.index)
    _util_samples[gpu.index] = (now_s, busy_s)
    if prev is None:
        return 0
    elapsed_s = now_s - prev[0]
    if elapsed_s <= 0:
        return 0
    return min(100, round(100 * (busy_s - prev[1]) / elapsed_s))


_fraction_notice_shown = False


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Validate `fraction` as torch does and say once that gpemu does not cap the allocator this way."""
    global _fraction_notice_shown
    index = device_index(device)
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _fractions[index] = float(fraction)
    if not _fraction_notice_shown:
        _fraction_notice_shown = True
        import sys

        print("gpemu: torch.cuda.set_per_process_memory_fraction is ignored; cap emulated memory with "
              "`gpemu run --memory-limit` (GPEMU_MEMORY_LIMIT)", file=sys.stderr)


def list_gpu_processes(device: Any = None) -> str:
    """Return torch.cuda.list_gpu_processes-style text: this process and its emulated reserved memory."""
    import os

    gpu = state.require().devices[device_index(device)]
    mib = gpu.allocator.memory_reserved() / 1024**2
    return f"GPU:{gpu.index}\nprocess {os.getpid():>10d} uses {mib:12.3f} MB GPU memory"


def _unsupported(name: str, message: str) -> Any:
    """Return a stand-in for torch.cuda.`name` that raises a GpemuError with `message`."""

    def fn(*args: Any, **kwargs: Any) -> Any:
        from gpemu.errors import GpemuError

        raise GpemuError(message)

    fn.__name__ = name
    return fn


def nvml_unsupported(name: str) -> Any:
    """Return a stand-in for an NVML/driver query gpemu does not model: it raises a GpemuError naming `name`."""
    return _unsupported(name, f"torch.cuda.{name}() is not emulated (it reads NVML/driver state gpemu does not model). "
                        "Workaround: guard the call (`if not os.environ.get('GPEMU_GPU')`) or drop it; "
                        "torch.cuda.utilization() and the memory API (memory_allocated, mem_get_info) are emulated.")


_history_notice_shown = False


def record_memory_history(*args: Any, **kwargs: Any) -> None:
    """Accept torch.cuda.memory._record_memory_history(...) and say once that gpemu keeps no allocation history."""
    global _history_notice_shown
    if not _history_notice_shown:
        _history_notice_shown = True
        import sys

        print("gpemu: torch.cuda.memory._record_memory_history is not emulated (no stack traces are kept); "
              "torch.cuda.memory_snapshot() lists the emulated allocator's live blocks, `gpemu run --trace` "
              "records memory over time", file=sys.stderr)


def memory_snapshot() -> list[dict[str, Any]]:
    """Return torch.cuda.memory_snapshot()-style segments: one entry per live emulated block (no stack frames)."""
    out: list[dict[str, Any]] = []
    for gpu in state.require().devices:
        for block in gpu.allocator.snapshot():
            out.append({
                "device": gpu.index, "address": block.segment_addr, "total_size": block.size_bytes,
                "allocated_size": block.size_bytes, "requested_size": block.requested_bytes,
                "stream": block.stream_id, "segment_type": "small" if block.small_pool else "large",
                "blocks": [{"size": block.size_bytes, "requested_size": block.requested_bytes,
                            "state": "active_allocated", "tag": block.tag}],
            })
    return out


def _unsupported_class(name: str, message: str) -> type:
    """Return a stand-in class for torch.cuda.`name` whose construction raises a GpemuError with `message`."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from gpemu.errors import GpemuError

        raise GpemuError(message)

    return type(name, (), {"__init__": __init__, "__module__": "torch.cuda", "__doc__": message})


# Note [Driver queries with a modelled answer]: some torch.cuda calls read the driver or NVML for a figure gpemu models
# anyway, so they answer from the model instead of failing: `_sleep(cycles)` (torch's own stream tests and tutorials
# use it to keep a stream busy) is a kernel of `cycles` SM clock ticks at the spec's boost clock (a one-thread spin
# loop does not load the GPU enough to drop below it); `clock_rate()` is NVML's SM clock in MHz, answered with the
# clock the timing model runs the GPU at under load (Note [Sustained clock] in gpemu/hardware/spec.py);
# `device_memory_used()` is NVML's used device memory, i.e. total minus cudaMemGetInfo's free (reserved memory plus
# CUDA contexts); `caching_allocator_alloc/delete` allocate raw blocks from the emulated caching allocator (the
# pointer is a stand-in address that only caching_allocator_delete understands); `get_per_process_memory_fraction`
# returns what set_per_process_memory_fraction was given (1.0 before). Temperature, power and BLAS handles stay
# unsupported: nothing in the model stands behind them.
def cuda_sleep(cycles: int) -> None:
    """torch.cuda._sleep: queue a kernel of `cycles` SM clock ticks on the current stream (see Note [Driver queries
    with a modelled answer])."""
    emu = state.require()
    index = emu.current_device()
    spec = emu.devices[index].spec
    emu.current_stream(index).enqueue(max(0, int(cycles)) / (spec.boost_clock_mhz * 1e6), "cuda_sleep", "compute",
                                      "kernel")


def clock_rate(device: Any = None) -> int:
    """torch.cuda.clock_rate: the SM clock (MHz) the timing model runs the emulated GPU at under load."""
    return round(state.require().devices[device_index(device)].spec.load_clock_mhz)


def device_memory_used(device: Any = None) -> int:
    """torch.cuda.device_memory_used: used device memory in bytes (total minus mem_get_info's free)."""
    free, total = state.require().devices[device_index(device)].allocator.mem_get_info()
    return int(total - free)


_fractions: dict[int, float] = {}
_raw_blocks: dict[int, tuple[int, int]] = {}  # stand-in pointer -> (device index, allocator handle)
_RAW_BASE = 0x7F00_0000_0000  # stand-in addresses of caching_allocator_alloc blocks (never dereferenced)
_raw_ids = itertools.count(1)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """torch.cuda.get_per_process_memory_fraction: the last fraction set for the device (1.0 before any)."""
    return _fractions.get(device_index(device), 1.0)


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """torch.cuda.caching_allocator_alloc: allocate `size` bytes from the emulated allocator; return a stand-in
    pointer for caching_allocator_delete."""
    emu = state.require()
    index = device_index(device)
    stream_id = stream._stream.pool_id if isinstance(stream, Stream) else emu.current_stream(index).pool_id
    handle = emu.devices[index].allocator.malloc(int(size), stream_id, "caching_allocator_alloc")
    if not handle:  # size 0: torch returns a null pointer
        return 0
    ptr = _RAW_BASE + next(_raw_ids) * 512
    _raw_blocks[ptr] = (index, handle)
    return ptr


def caching_allocator_delete(mem_ptr: int) -> None:
    """torch.cuda.caching_allocator_delete: free a block from caching_allocator_alloc (0 is a no-op)."""
    if not mem_ptr:
        return
    found = _raw_blocks.pop(int(mem_ptr), None)
    if found is None:
        raise ValueError(f"torch.cuda.caching_allocator_delete: {mem_ptr:#x} was not returned by "
                         "torch.cuda.caching_allocator_alloc under this emulation")
    index, handle = found
    state.require().devices[index].allocator.free(handle)


def stream_priority_range() -> tuple[int, int]:
    """torch.cuda.Stream.priority_range: (lowest, highest) as CUDA reports it on Volta and newer (0, -5)."""
    return (0, -5)


Stream.priority_range = staticmethod(stream_priority_range)  # type: ignore[attr-defined]


def unsupported_class(name: str, why: str, workaround: str) -> type:
    """Return a stand-in class for torch.cuda.`name` whose construction raises a GpemuError saying why and what to
    do instead (a class, as torch's is: code may name it in isinstance checks and annotations)."""
    return _unsupported_class(name, f"torch.cuda.{name} is not emulated ({why}). Workaround: {workaround}")


def reset_state() -> None:
    """Forget per-emulation answers (memory fractions, raw blocks, utilization samples) at uninstall."""
    _fractions.clear()
    _raw_blocks.clear()
    _util_samples.clear()
