"""The top-level public API is pinned: adding or removing a name is a deliberate change."""

from __future__ import annotations

import gpemu


def test_all_is_pinned() -> None:
    assert sorted(gpemu.__all__) == sorted(
        [
            "Emulator",
            "Estimate",
            "GPUSpec",
            "GpemuError",
            "GpemuWarning",
            "UnknownNameError",
            "__version__",
            "get_gpu",
            "install",
            "list_gpus",
            "uninstall",
        ]
    )


def test_every_exported_name_resolves() -> None:
    for name in gpemu.__all__:
        assert getattr(gpemu, name) is not None
