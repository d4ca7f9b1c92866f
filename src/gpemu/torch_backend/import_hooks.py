"""Patch a module when it is imported, or at once if it already is (for modules too costly or noisy to import)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpemu.torch_backend.patches import Patcher


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the patch."""

    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Hands one module's import to _Loader."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self._name, self._patch = name, patch

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self._patch)
                return spec  # type: ignore[no-any-return]
        return None


def patch_when_imported(name: str, patch: Callable[[ModuleType, Patcher], None], patcher: Patcher) -> None:
    """Apply `patch(module, patcher)` to module `name` now if it is imported, else when it is; uninstall removes the
    import hook (the patcher restores what `patch` set)."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module, patcher)
        return
    finder = _Finder(name, lambda m: patch(m, patcher))
    sys.meta_path.insert(0, finder)

    def remove() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    patcher.on_restore(remove)
