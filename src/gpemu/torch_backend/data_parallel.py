"""torch.nn.DataParallel across several emulated GPUs: the C++ communication helpers redone with Tensor.to.

Note [DataParallel on emulated GPUs]: DataParallel replicates the module with `comm.broadcast_coalesced`, scatters
the batch with `comm.scatter`, runs the replicas in threads (`parallel_apply`) and gathers the outputs with
`comm.gather`; backward reduces gradients with `comm.reduce_add_coalesced`. The C++ versions of broadcast, scatter
and gather call the CUDA driver, and `nccl.is_available` would send reductions to NCCL. Under emulation the
broadcast is one peer copy per tensor (torch coalesces into 10 MiB buckets: same bytes, more launches), gather is
peer copies plus `cat`, reductions take torch's own Python fallback (peer copies plus `add`), and `nccl` reports
itself unavailable. Peer copies are priced over NVLink when the spec has it, else PCIe (ops.peer_copy). Scatter is
patched in patches.py (it also serves the one-GPU case, where only scatter runs).
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


def gather(tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None) -> torch.Tensor:
    """comm.gather: copy every part to the destination and concatenate along `dim`."""
    if out is not None:
        return out.copy_(torch.cat([t.to(out.device) for t in tensors], dim))
    dev = _target(destination)
    return torch.cat([t if t.device == dev else t.to(dev) for t in tensors], dim)


def apply(patcher: Any) -> None:
    """Install the DataParallel communication helpers (see Note [DataParallel on emulated GPUs])."""
    import torch.cuda.nccl as nccl
    import torch.nn.parallel.comm as comm

    patcher.set(comm, "broadcast", broadcast)
    patcher.set(comm, "broadcast_coalesced", broadcast_coalesced)
    patcher.set(comm, "gather", gather)
    patcher.set(nccl, "is_available", lambda tensors: False)
