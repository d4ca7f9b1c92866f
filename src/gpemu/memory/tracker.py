"""MemoryTracker: runs torch code on the `meta` device and charges every new storage to a CachingAllocator.

See Note [Tracking storages on meta].
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from types import TracebackType

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpemu.device.allocator import CachingAllocator
from gpemu.memory.workspaces import ensure_cublas_workspace

# Note [Tracking storages on meta]
# A meta tensor has shape, dtype and a StorageImpl with nbytes but no memory. Every op output whose StorageImpl we
# have not seen is charged once with malloc(storage.nbytes()); views and in-place results share a StorageImpl and
# cost nothing. torch keeps one Python object per live StorageImpl (PyObject preservation), so a weakref.finalize
# on `untyped_storage()` fires exactly when the last tensor or view on it dies; that frees the block, as the CUDA
# caching allocator frees a block when its DataPtr dies. Tensors made outside the mode (a model built on meta,
# parameters) are charged with track().

_MATMUL_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
    torch.ops.aten.addbmm.default,
}


class MemoryTracker:
    """Context manager charging meta-tensor storages to `allocator`; `tag` labels new allocations."""

    def __init__(
        self,
        allocator: CachingAllocator,
        stream_id: int = 0,
        cublas_workspace_bytes: int = 0,
    ) -> None:
        self.allocator = allocator
        self.stream_id = stream_id
        self.cublas_workspace_bytes = cublas_workspace_bytes
        self.tag = ""
        self._live: dict[int, int] = {}  # StorageImpl address -> allocator handle
        self._mode = _TrackingMode(self)

    def track(self, tensors: Iterable[torch.Tensor] | torch.Tensor, tag: str | None = None) -> None:
        """Charge the storages of tensors made outside the tracker (e.g. parameters of a model built on meta)."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        for t in tensors:
            self._charge(t, self.tag if tag is None else tag)

    def live_bytes(self) -> int:
        """Return the bytes currently charged by this tracker."""
        return sum(self.allocator.size_of(h) for h in self._live.values())

    def _charge(self, t: torch.Tensor, tag: str) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        nbytes = storage.nbytes()
        handle = self.allocator.malloc(nbytes, self.stream_id, tag)
        self._live[key] = handle
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        handle = self._live.pop(key, None)
        if handle is not None:
            self.allocator.free(handle)

    def __enter__(self) -> MemoryTracker:
        self._mode.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._mode.__exit__(exc_type, exc, tb)


class _TrackingMode(TorchDispatchMode):
    def __init__(self, tracker: MemoryTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        tracker = self.tracker
        if tracker.cublas_workspace_bytes and func in _MATMUL_OPS:
            # See Note [Library workspaces] in gpemu.memory.workspaces
            ensure_cublas_workspace(tracker.allocator, tracker.stream_id, tracker.cublas_workspace_bytes)
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        tag = tracker.tag
        for t in flat:
            # meta tensors stand for device memory; a CPU tensor made meanwhile (a module imported lazily during the
            # step builds its constants) is host memory and was charged to the GPU, once per process
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                tracker._charge(t, tag)
        return out
