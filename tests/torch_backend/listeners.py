"""Test helpers: a device listener that keeps every work item's name and duration."""

from __future__ import annotations

from typing import Any


class KernelLog:
    """Device listener that keeps (name, seconds) of every work item placed on the timeline."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float]] = []

    def on_work(self, work: Any) -> None:
        """Keep the item's name and duration."""
        self.items.append((work.name, work.duration_s))

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        """Ignore host waits."""
