"""`module:factory` models for gpemu's zoo from timm: `bench._timm_zoo:<timm name>` builds that model (random init).

Used by bench/timm_validation.py through gpemu's user-factory path (gpemu.workloads.models, "package.module:factory").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def __getattr__(name: str) -> Callable[[], Any]:
    """Return a factory for the timm model `name` (module-level __getattr__: any timm name is an attribute)."""
    if name.startswith("__"):
        raise AttributeError(name)

    def factory() -> Any:
        import timm

        return timm.create_model(name, pretrained=False)

    factory.__name__ = name
    return factory
