"""Memory prediction: simulate training steps on meta tensors against the caching-allocator model."""

from gpemu.memory.autograd_compat import legacy_hardtanh
from gpemu.memory.predict import (
    GPEMU_DATA_SEMANTICS,
    StepMemory,
    build_workload,
    fits,
    max_batch_size,
    new_allocator,
    predict_memory,
    simulate_training,
)
from gpemu.memory.tracker import MemoryTracker
from gpemu.memory.workspaces import cublas_workspace_bytes

__all__ = [
    "GPEMU_DATA_SEMANTICS",
    "MemoryTracker",
    "StepMemory",
    "build_workload",
    "cublas_workspace_bytes",
    "fits",
    "legacy_hardtanh",
    "max_batch_size",
    "new_allocator",
    "predict_memory",
    "simulate_training",
]
