"""torch.distributed on emulated GPUs: the process group that stands in for NCCL (one rank for now)."""

from gpemu.distributed.process_group import BACKEND_NAME, SingleRankGroup, register_backend, world_size_of

__all__ = ["BACKEND_NAME", "SingleRankGroup", "register_backend", "world_size_of"]
