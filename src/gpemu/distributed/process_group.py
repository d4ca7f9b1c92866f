"""The process group that stands in for NCCL under emulation: one rank, every collective exact, priced on the stream.

Note [One-rank process groups]: many public training scripts always call `init_process_group("nccl")` (torchrun
with --nproc_per_node=1, Lightning's strategy="ddp", accelerate) and wrap the model in DistributedDataParallel even
on one GPU. NCCL needs a CUDA driver, so under emulation an NCCL (or default, cuda) group of world size 1 is created
with this backend instead. With one rank every collective is exact without communication: all_reduce, reduce and
broadcast leave the data as it is; all_gather, gather, scatter, reduce_scatter and all_to_all copy the one input to
the one output (a device-to-device copy, priced like any copy). Each collective on an emulated tensor also puts a
zero-length NCCL item on the tensor's current stream (the launch latency only: NCCL with one rank moves nothing),
so the trace shows where DDP communicated. CPU tensors work too (gloo semantics with one rank). A world size above 1
raises a GpemuError: several processes sharing emulated time is the next milestone (design.md, `distributed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from gpemu.errors import GpemuError

BACKEND_NAME = "gpemu"
MULTI_RANK_HINT = (
    "several processes on emulated GPUs (a process group of world size {size}) are not emulated yet: gpemu's "
    "multi-GPU support is the next milestone. One process works (torchrun --nproc_per_node=1, WORLD_SIZE=1), and so "
    "does torch.nn.DataParallel over `gpemu run --count N` GPUs in one process."
)


def _done(result: Any) -> Any:
    fut: Future[Any] = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _announce(name: str, tensors: Sequence[torch.Tensor]) -> None:
    """Put a zero-length NCCL item on the current stream of each emulated device among `tensors`."""
    from gpemu.torch_backend.tensor import EmuTensor, charge

    seen: set[int] = set()
    for t in tensors:
        if isinstance(t, EmuTensor):
            index = t.device.index or 0
        elif t.device.type == "meta":  # DDP's buckets (Note [DDP on one rank]): on the current device
            index = torch.cuda.current_device()
        else:
            continue
        if index not in seen:
            seen.add(index)
            charge(index, f"nccl:{name} (1 rank)", 0.0)


def _copy_pairs(name: str, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    _announce(name, [src for _, src in pairs])
    with torch.no_grad():
        for dst, src in pairs:
            if dst is not src:
                dst.copy_(src)


# torch's stubs give the collectives overloads a Python override cannot match; the C++ trampoline calls these
_ProcessGroup: Any = dist.ProcessGroup


class SingleRankGroup(_ProcessGroup):
    """A world-size-1 process group whose collectives are exact local operations (Note [One-rank process groups])."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._gpemu_group_name = ""

    # C++ ProcessGroup keeps its name on its backends, and a Python group has none: torch's `_set_group_name` was a
    # no-op and `group_name` raised "ProcessGroup name not set" (DeviceMesh, FSDP2's fully_shard). Keep it here.
    def _set_group_name(self, name: str) -> None:
        self._gpemu_group_name = name

    @property
    def group_name(self) -> str:
        """Return the name torch gave this group when it created it."""
        if not self._gpemu_group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._gpemu_group_name

    # -- reductions and broadcasts: the data already is the result

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Return a completed work; one rank's sum is its own tensor."""
        _announce("all_reduce", tensors)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Return a completed work over several tensors."""
        _announce("all_reduce_coalesced", tensors)
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Return a completed work: the root is this rank."""
        _announce("reduce", tensors)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Return a completed work: the source is this rank."""
        _announce("broadcast", tensors)
        return _done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        """Return a completed work: nobody to wait for."""
        return _done(None)

    # -- gathers and scatters: copy the one input to the one output

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """Copy each input into its one-element output list."""
        _copy_pairs("all_gather", [(out[0], inp) for out, inp in zip(outputs, inputs, strict=True)])
        return _done(outputs)

    def _allgather_base(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        _copy_pairs("all_gather_into_tensor", [(output, inp)])
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        """Copy each input into its output."""
        _copy_pairs("all_gather_into_tensor_coalesced", list(zip(outputs, inputs, strict=True)))
        return _done(outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """Copy each input into the root's (this rank's) one-element output list."""
        _copy_pairs("gather", [(out[0], inp) for out, inp in zip(outputs, inputs, strict=True)])
        return _done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Copy this rank's one chunk into its output."""
        _copy_pairs("scatter", [(out, inp[0]) for out, inp in zip(outputs, inputs, strict=True)])
        return _done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Copy this rank's one chunk into its output."""
        _copy_pairs("reduce_scatter", [(out, inp[0]) for out, inp in zip(outputs, inputs, strict=True)])
        return _done(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        _copy_pairs("reduce_scatter_tensor", [(output, inp)])
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        """Copy each input into its output."""
        _copy_pairs("reduce_scatter_tensor_coalesced", list(zip(outputs, inputs, strict=True)))
        return _done(outputs)

    def alltoall_base(self, output: torch.Tensor, inp: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> Any:
        """Copy the input into the output (one rank sends everything to itself)."""
        _copy_pairs("all_to_all_single", [(output, inp)])
        return _done([output])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """Copy each input into its output."""
        _copy_pairs("all_to_all", list(zip(outputs, inputs, strict=True)))
        return _done(outputs)

    # -- point to point: there is no peer

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """Raise: a one-rank group has no peer to send to."""
        raise GpemuError(f"send to rank {dst} in a process group of one rank: there is no peer")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """Raise: a one-rank group has no peer to receive from."""
        raise GpemuError(f"recv from rank {src} in a process group of one rank: there is no peer")

    def getBackendName(self) -> str:
        """Return the backend's name as torch.distributed.get_backend reports it."""
        return BACKEND_NAME


def _create(store: Any, rank: int, size: int, timeout: Any) -> SingleRankGroup:
    if size != 1:
        raise GpemuError(MULTI_RANK_HINT.format(size=size))
    return SingleRankGroup(rank, size)


def register_backend() -> None:
    """Register the `gpemu` backend with torch.distributed (once per process)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


def world_size_of(init_args: Sequence[Any], init_kwargs: dict[str, Any]) -> int | None:
    """Return the world size an init_process_group(backend, *args, **kwargs) call asks for, or None if unknown."""
    import os
    import re

    size = init_kwargs.get("world_size", init_args[2] if len(init_args) > 2 else -1)
    if size is not None and int(size) > 0:
        return int(size)
    method = str(init_kwargs.get("init_method", init_args[0] if init_args else "") or "")
    found = re.search(r"[?&]world_size=(\d+)", method)
    if found:
        return int(found.group(1))
    env = os.environ.get("WORLD_SIZE")
    return int(env) if env and env.isdigit() else None
