"""torch.nn.DataParallel across several emulated GPUs: the C++ communication helpers redone with Tensor.to.

Note [DataParallel on emulated GPUs]: DataParallel replicates the module with `comm.broadcast_coalesced`, scatters
the batch with `comm.scatter`, runs the replicas in threads (`parallel_apply`) and gathers the outputs with
`comm.gather`; backward reduces gradients with `comm.reduce_add_coalesced`. The C++ versions of broadcast, scatter
and gather call the CUDA driver, and `nccl.is_available` would send reductions to NCCL. Under emulation the
broadcast is one peer copy per tensor (torch coalesces into 10 MiB buckets: same bytes, more launches), gather is
peer copies plus `cat`, reductions take torch's own Python fallback (peer copies plus `add`), and `nccl` reports
itself unavailable. Scatter copies each chunk with Tensor.to on Scatter's background copy stream, which is an
emulated stream (torch.Stream would call the CUDA driver): a CPU batch becomes emulated H2D copies (one GPU too:
pytorch/examples imagenet's validate() feeds DataParallel host tensors). Peer copies are priced over NVLink when the
spec has it, else PCIe (ops.peer_copy).
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.torch_backend import cuda_api


def _target(device: Any) -> torch.device:
    """Return cuda:N for an int / device / string (None: the current device)."""
    if isinstance(device, torch.device) and device.type == "cpu":
        return device
    if isinstance(device, str) and device.startswith("cpu"):
        return torch.device("cpu")
    return torch.device("cuda", cuda_api.device_index(device))


def broadcast(tensor: torch.Tensor, devices: Any = None, *, out: Any = None) -> tuple[torch.Tensor, ...]:
    """comm.broadcast: one copy of `tensor` per device (the source device gets the tensor itself)."""
    if out is not None:
        for o in out:
            o.copy_(tensor)
        return tuple(out)
    return tuple(tensor if _target(d) == tensor.device else tensor.to(_target(d)) for d in devices)


def broadcast_coalesced(tensors: Any, devices: Any, buffer_size: int = 10485760) -> list[tuple[torch.Tensor, ...]]:
    """comm.broadcast_coalesced: per device, the tensors (the first device gets the inputs themselves)."""
    targets = [_target(d) for d in devices]
    return [tuple(t if t.device == dev else t.to(dev) for t in tensors) for dev in targets]


def scatter_with(orig: Any) -> Any:
    """Return comm.scatter in Python: chunks copied with Tensor.to, each on its copy stream (`orig` serves `out=`)."""

    def scatter(tensor: torch.Tensor, devices: Any = None, chunk_sizes: Any = None, dim: int = 0, streams: Any = None,
                *, out: Any = None) -> Any:
        if out is not None or devices is None:
            return orig(tensor, devices, chunk_sizes, dim, streams, out=out)
        index = [cuda_api.device_index(d) for d in devices]
        chunks = tensor.chunk(len(index), dim) if chunk_sizes is None else tensor.split(list(chunk_sizes), dim)
        outs = []
        for n, (c, i) in enumerate(zip(chunks, index, strict=True)):
            with cuda_api.StreamContext(streams[n] if streams else None):  # Scatter's background copy stream
                outs.append(c.to(torch.device("cuda", i), non_blocking=True))
        return tuple(outs)

    return scatter


def gather(tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None) -> torch.Tensor:
    """comm.gather: copy every part to the destination and concatenate along `dim`."""
    if out is not None:
        return out.copy_(torch.cat([t.to(out.device) for t in tensors], dim))
    dev = _target(destination)
    return torch.cat([t if t.device == dev else t.to(dev) for t in tensors], dim)


def apply(patcher: Any) -> None:
    """Install the DataParallel communication helpers (see Note [DataParallel on emulated GPUs])."""
    import torch.cuda.nccl as nccl
    import torch.nn.parallel._functions as parallel_functions
    import torch.nn.parallel.comm as comm

    copy_streams: dict[int, cuda_api.Stream] = {}

    def get_stream(device: torch.device) -> cuda_api.Stream | None:
        """Scatter's background copy stream for `device`: one emulated stream per device for this installation."""
        if device.type != "cuda":
            return None
        i = cuda_api.device_index(device)
        if i not in copy_streams:
            copy_streams[i] = cuda_api.Stream(i)
        return copy_streams[i]

    patcher.set(parallel_functions, "_get_stream", get_stream)
    patcher.set(comm, "scatter", scatter_with(comm.scatter))
    patcher.set(comm, "broadcast", broadcast)
    patcher.set(comm, "broadcast_coalesced", broadcast_coalesced)
    patcher.set(comm, "gather", gather)
    patcher.set(nccl, "is_available", lambda tensors: False)
