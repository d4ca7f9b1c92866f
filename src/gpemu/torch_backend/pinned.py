"""Host pinned memory on a machine without a driver: pinning is real host work (a copy into a host buffer).

Everything goes through `pin()` and `is_pinned()`, so the pinned-pool model (`gpemu.host.pinned`) can replace the
plain clone used here without touching the torch patches.
"""

from __future__ import annotations

import weakref

import torch

# id(tensor) -> weakref of CPU tensors pinned by gpemu (a plain set would keep them alive)
_pinned: dict[int, weakref.ref[torch.Tensor]] = {}


def pin(t: torch.Tensor) -> torch.Tensor:
    """Return a pinned copy of a CPU tensor (real host copy work, as cudaHostAlloc + memcpy would cost)."""
    try:  # the pinned-pool model, when another part of gpemu provides it
        from gpemu.host.pinned import pin_tensor  # type: ignore[import-not-found]

        out = pin_tensor(t)
    except ImportError:
        out = t.clone(memory_format=torch.contiguous_format)
    mark_pinned(out)
    return out


def mark_pinned(t: torch.Tensor) -> None:
    """Record that a CPU tensor lives in pinned memory."""
    key = id(t)
    _pinned[key] = weakref.ref(t, lambda _ref, key=key: _pinned.pop(key, None))  # type: ignore[misc]


def is_pinned(t: torch.Tensor) -> bool:
    """Return True when `t` (or the tensor it views... by identity only) was pinned by gpemu."""
    ref = _pinned.get(id(t))
    return ref is not None and ref() is t
