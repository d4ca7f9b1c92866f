"""torch.load onto the emulated device: `map_location="cuda"` (any spelling) and checkpoints saved from real CUDA runs.

See Note [Loading onto the emulated device]: every storage whose (mapped) location is `cuda[:N]` is read to the host
as usual, then one emulated storage of the same size is allocated on `cuda:N` with a host-to-device copy charged,
and the tensors over it are rebuilt as views of that emulated storage (so shared storages stay shared).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch._utils as torch_utils
import torch.serialization as ser

from gpemu.errors import GpemuError
from gpemu.torch_backend import state
from gpemu.torch_backend.tensor import META, EmuTensor

_local = threading.local()  # .targets: {storage _cdata: device index}, .bases: {storage _cdata: emulated uint8 base}


def _cuda_target(location: Any) -> int | None:
    """Return the emulated index a location string/device names, or None when it is not a cuda location."""
    if isinstance(location, bytes):
        location = location.decode()
    if isinstance(location, torch.device):
        location = str(location)
    if not isinstance(location, str) or not location.startswith("cuda"):
        return None
    emu = state.require()
    index = torch.device(location).index
    if index is None:
        return emu.current_device()
    if not 0 <= index < len(emu.devices):
        raise GpemuError(
            f"torch.load: the checkpoint puts a tensor on {location}, but gpemu emulates {len(emu.devices)} GPU(s). "
            f"Workaround: pass map_location='cuda:0' (or a dict like {{'{location}': 'cuda:0'}}), or emulate more "
            "GPUs with `gpemu run --count`."
        )
    return index


def _cuda_marker(targets: dict[int, int]) -> Callable[..., Any]:
    """Return a stand-in for `storage.cuda(device)` that records the storage for `device` and returns it unchanged."""

    def cuda(storage: Any, device: Any = None, non_blocking: bool = False) -> Any:
        from gpemu.torch_backend.cuda_api import device_index

        untyped = storage._untyped_storage if isinstance(storage, torch.storage.TypedStorage) else storage
        targets[untyped._cdata] = device_index(device)
        return storage

    return cuda


def _restore_location(map_location: Any, targets: dict[int, int]) -> Callable[[Any, str], Any]:
    """Return a map_location callable that keeps cuda-bound storages on the host and records their device."""

    def mapped(storage: Any, location: str) -> Any:
        if map_location is None:
            return location
        if isinstance(map_location, dict):
            return map_location.get(location, location)
        if isinstance(map_location, (str, bytes, torch.device)):
            return str(map_location) if isinstance(map_location, torch.device) else map_location
        return _call_user(map_location, storage, location, targets)

    def restore(storage: Any, location: str) -> Any:
        where = mapped(storage, location)
        if not isinstance(where, (str, bytes)):  # a callable map_location returned a storage
            return where
        index = _cuda_target(where)
        if index is None:
            return ser.default_restore_location(storage, where.decode() if isinstance(where, bytes) else where)
        targets[storage._cdata] = index
        return storage

    return restore


def _call_user(map_location: Callable[..., Any], storage: Any, location: str, targets: dict[int, int]) -> Any:
    """Run a user's map_location callable with `storage.cuda()` recording instead of copying; return its answer."""
    from gpemu.torch_backend.patches import Patcher

    patcher = Patcher()
    try:
        for cls in (torch.UntypedStorage, torch.storage.TypedStorage):
            patcher.set(cls, "cuda", _cuda_marker(targets))
        result = map_location(storage, location)
    finally:
        patcher.restore()
    return location if result is None else result


def _patched_load(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_local, "targets", None), getattr(_local, "bases", None)
        _local.targets, _local.bases = {}, {}
        try:
            return orig(f, _restore_location(map_location, _local.targets), *args, **kwargs)
        finally:
            _local.targets, _local.bases = outer

    return load


def _patched_rebuild_tensor(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> Any:
        targets = getattr(_local, "targets", None)
        untyped = getattr(storage, "_untyped_storage", storage)
        index = targets.get(untyped._cdata) if targets else None
        if index is None:
            return orig(storage, storage_offset, size, stride)
        out = _emulated_view(untyped, storage.dtype, index, storage_offset, size, stride)
        # RNG states, step counters keep their host values; weights read back as zeros (no second host copy)
        from gpemu.torch_backend.ops import KNOWN_VALUE_MAX_BYTES, set_known_value

        if untyped.nbytes() <= KNOWN_VALUE_MAX_BYTES:
            set_known_value(out, orig(storage, storage_offset, size, stride))
        return out

    return _rebuild_tensor


def _emulated_view(untyped: Any, dtype: torch.dtype, index: int, offset: int, size: Any, stride: Any) -> EmuTensor:
    """Return an emulated tensor over the emulated copy of `untyped` (copied to `cuda:index` once per load)."""
    from gpemu.torch_backend.ops import host_to_device

    bases: dict[int, EmuTensor] = _local.bases
    base = bases.get(untyped._cdata)
    if base is None:
        nbytes = untyped.nbytes()
        # a meta stand-in for the host bytes: host_to_device needs only size, dtype and pinnedness (pageable)
        base = bases[untyped._cdata] = host_to_device(torch.empty(nbytes, dtype=torch.uint8, device=META), index)
    typed = base if dtype == torch.uint8 else base.view(dtype)
    return typed.as_strided(tuple(size), tuple(stride), offset)  # type: ignore[return-value]


def apply(patcher: Any) -> None:
    """Patch torch.load (and the tensor rebuild it uses) to put cuda-bound storages on the emulated device."""
    patcher.set(torch, "load", _patched_load(torch.load))
    patcher.set(ser, "load", torch.load)
    patcher.set(torch_utils, "_rebuild_tensor", _patched_rebuild_tensor(torch_utils._rebuild_tensor))


# Note [Loading onto the emulated device]: torch.load resolves every storage's location through map_location (None:
# the location tag saved with it, e.g. "cuda:0" for a checkpoint written on a GPU; a str or torch.device; a dict
# remapping tags; a callable that may call `storage.cuda(i)`), then copies the storage there. Without a driver that
# copy fails. gpemu wraps torch.load with a map_location callable that resolves the user's map_location the same way
# but, for a cuda location, leaves the storage on the host and records the target device. When torch's unpickler
# rebuilds a tensor (torch._utils._rebuild_tensor, which every _rebuild_tensor_v2/v3 and Parameter rebuild calls),
# a recorded storage becomes one emulated storage (allocated on the device allocator; a pageable H2D copy of its
# bytes charged once per storage) and the tensor is an as_strided view of it. A cuda index beyond the emulated count
# raises a GpemuError naming map_location and --count as workarounds. Small storages (<= ops.KNOWN_VALUE_MAX_BYTES) keep
# their host values, so `torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu())` after a cuda map_location restores the
# real state.
