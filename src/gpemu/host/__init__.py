"""Host-side emulation: pinned (page-locked) host memory pool."""

from gpemu.host.pinned import (
    GpemuWarning,
    PinnedPool,
    default_pool,
    is_pinned,
    pin_tensor,
    pinned_bytes,
    size_class,
)

__all__ = ["GpemuWarning", "PinnedPool", "default_pool", "is_pinned", "pin_tensor", "pinned_bytes", "size_class"]
