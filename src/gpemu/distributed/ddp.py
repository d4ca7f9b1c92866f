"""DistributedDataParallel over emulated parameters in a one-rank gpemu process group.

Note [DDP on one rank]: DDP's C++ Reducer creates its gradient buckets with the parameters' options, which for
emulated parameters are plain meta tensors, and two of its steps read device data back to the host: the
cross-process parameter-shape check at construction and the bucket-order sync before the second forward
(`_rebuild_buckets`). With one rank both are trivially satisfied (every rank has the same shapes and the same bucket
order), so under emulation the check is skipped for one-rank groups and emulated reducers keep their first buckets:
torch starts DDP with one bucket for all parameters and a real run rebuilds it once into ~25 MiB buckets in
gradient-ready order; the emulated run keeps the one bucket (the same bytes; with one rank there is no
communication for the smaller buckets to overlap with the backward pass). Everything else is DDP's own
code: bucketing hooks, the gradient copies into the buckets and back (priced like any copy), no_sync, find_unused_
parameters, static_graph, comm hooks on the process group. The buckets themselves are meta, so their memory (one
copy of every trainable parameter, DDP's well-known overhead) is allocated on the emulated device as one block that
lives as long as the DDP module; with gradient_as_bucket_view=True the gradients are the buckets on a real GPU, so
no block is added, and DDP is given gradient_as_bucket_view=False (meta bucket views cannot become gradients).
The per-forward buffer broadcast from rank 0 is skipped (one rank: to itself), and the wrapped network replays like
a top module (Note [Replay path]; replay.py `_replays_inside`) while the Reducer's hooks on AccumulateGrad run per op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from gpemu.distributed.process_group import BACKEND_NAME
from gpemu.errors import GpemuError

_EMULATED_REDUCERS: dict[int, Any] = {}  # id -> reducer (kept alive so an id is never reused)


def is_emulated_reducer(reducer: Any) -> bool:
    """Return True for the Reducer of a DDP built by init_emulated_ddp."""
    return reducer is not None and _EMULATED_REDUCERS.get(id(reducer)) is reducer


def patched_rebuild_buckets(orig: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Reducer._rebuild_buckets: an emulated reducer keeps its buckets (Note [DDP on one rank])."""

    def _rebuild_buckets(self: Any) -> bool:
        if id(self) in _EMULATED_REDUCERS:
            return False
        return orig(self)

    return _rebuild_buckets


def patched_verify_param_shapes(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_verify_param_shape_across_processes: nothing to compare in a one-rank group (Note [DDP on one rank])."""

    def _verify_param_shape_across_processes(process_group: Any, tensors: Any, logger: Any = None) -> Any:
        if process_group is not None and process_group.size() == 1:
            return None
        return orig(process_group, tensors, logger)

    return _verify_param_shape_across_processes


# Note [DDP logger]: DDP's forward asks its C++ Logger to sample runtime stats (iterations
# 1-10, then every 100th). The Logger times the step with a timer the Reducer made for its parameters' device type,
# and only CPU and CUDA have one: for emulated (C++ meta) parameters there is none, so the first sampled forward
# printed a C++ warning straight to stderr ("Time stats are currently only collected for CPU and CUDA devices.
# Please refer to CpuTimer or CudaTimer ...", logger.cpp) in every one-rank DDP run (pytorch/examples
# ddp-tutorial-series, minGPT-ddp): it names torch internals, not anything the user did. Without a timer the
# sampling records no time stats anyway, so an emulated DDP's logger skips it; everything else (construction data,
# comm hook names, static graph, `_get_ddp_logging_data()`) goes to the real Logger.
class UntimedDdpLogger:
    """DDP's C++ Logger for an emulated DDP, without runtime-stats sampling (Note [DDP logger])."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger  # also keeps the C++ Logger alive: the Reducer holds only a weak reference

    def set_runtime_stats_and_log(self) -> None:
        """Nothing to sample: the emulated device has no DDP timer."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def init_emulated_ddp(orig: Callable[..., None], ddp: Any, module: torch.nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
    """Run DistributedDataParallel.__init__ for a module with emulated parameters (Note [DDP on one rank])."""
    group = kwargs.get("process_group")
    if group is None and dist.is_initialized():
        group = dist.distributed_c10d._get_default_group()
    if group is not None and dist.get_backend(group) != BACKEND_NAME:
        raise GpemuError(
            f"DistributedDataParallel({type(module).__name__}) on an emulated GPU over a {dist.get_backend(group)!r} "
            "process group: emulated parameters need gpemu's process group, which init_process_group('nccl') (or "
            "no backend) creates under emulation for one rank."
        )
    buckets_are_grads = bool(kwargs.get("gradient_as_bucket_view", False))
    kwargs["gradient_as_bucket_view"] = False
    from gpemu.torch_backend.ops import known_value, set_known_value
    from gpemu.torch_backend.tensor import EmuTensor

    kept = [(b, v) for b in module.buffers() if isinstance(b, EmuTensor) and (v := known_value(b)) is not None]
    orig(ddp, module, *args, **kwargs)
    # Note [Buffers through DDP's initial broadcast]: DDP's constructor broadcasts the parameters and buffers from
    # rank 0 (flattened into one tensor, broadcast, copied back). On one rank they come back unchanged, but the copy
    # back made gpemu forget the values it knew: facebookresearch/moco's `queue_ptr` buffer read 0 ever after. The
    # buffers whose values were known before keep them.
    for b, v in kept:
        if known_value(b) is None:
            set_known_value(b, v)
    reducer = getattr(ddp, "reducer", None)
    if reducer is not None:
        _EMULATED_REDUCERS[id(reducer)] = reducer
    if getattr(ddp, "logger", None) is not None:
        ddp.logger = UntimedDdpLogger(ddp.logger)
    # broadcast_buffers: every forward broadcasts the buffers from rank 0, i.e. to itself here (a flatten, a no-op
    # broadcast and an unflatten: ~50 ms of the emulator's host time per resnet50 step for microseconds of GPU time)
    ddp._sync_buffers = lambda: None
    if not buckets_are_grads:
        trainable = [p for p in module.parameters() if p.requires_grad]
        if trainable:
            bytes_ = sum(p.numel() * p.element_size() for p in trainable)
            ddp._gpemu_bucket_memory = torch.empty(bytes_, dtype=torch.uint8, device=trainable[0].device)
