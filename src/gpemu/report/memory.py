"""Memory report for `gpemu run --memory-report`: peak, persistent after a step, and the top allocations by module."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpemu.device.gpu import EmulatedGPU

MIB = 2**20
_tls = threading.local()


def _module_stack() -> list[str]:
    stack: list[str] | None = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def _in_backward() -> bool:
    import torch

    return bool(torch._C._current_graph_task_id() != -1)


@dataclass
class DeviceMemoryLog:
    """What one device's allocator did, grouped by the module that asked (`backward` and `(outside modules)` too)."""

    live_by_owner: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    owner_of: dict[int, tuple[str, int]] = field(default_factory=dict)  # handle -> (owner, size_bytes)
    peak_bytes: int = 0
    peak_by_owner: dict[str, int] = field(default_factory=dict)
    after_step_bytes: list[int] = field(default_factory=list)


class MemoryReport:
    """Watches every device allocator of a run; answers peak, persistent and the owners of memory at the peak."""

    def __init__(self, devices: list[EmulatedGPU], top_n: int = 10) -> None:
        self.devices = devices
        self.top_n = top_n
        self.logs = [DeviceMemoryLog() for _ in devices]
        self._roots: dict[int, dict[int, str]] = {}
        self._handles: list[Any] = []
        for device, log in zip(devices, self.logs, strict=True):
            self._wrap_allocator(device, log)
        self._install_module_hooks()

    # -- who owns an allocation -------------------------------------------------------------------------------------
    def _install_module_hooks(self) -> None:
        from torch.nn.modules import module as nn_module

        def pre(mod: Any, args: Any) -> None:
            stack = _module_stack()
            if not stack or id(mod) not in self._names_for(stack):
                # A new top-level module: name its submodules once (names like "layer1.0.conv1").
                self._roots[id(mod)] = {id(m): (n or type(mod).__name__) for n, m in mod.named_modules()}
                stack.append(f"@{id(mod)}")
            stack.append(self._roots.get(self._root_id(stack), {}).get(id(mod), type(mod).__name__))

        def post(mod: Any, args: Any, out: Any) -> None:
            stack = _module_stack()
            if stack and not stack[-1].startswith("@"):
                stack.pop()
            if stack and stack[-1] == f"@{id(mod)}":
                stack.pop()

        self._handles.append(nn_module.register_module_forward_pre_hook(pre))
        self._handles.append(nn_module.register_module_forward_hook(post))

    def _root_id(self, stack: list[str]) -> int:
        roots = [s for s in stack if s.startswith("@")]
        return int(roots[-1][1:]) if roots else -1

    def _names_for(self, stack: list[str]) -> dict[int, str]:
        return self._roots.get(self._root_id(stack), {})

    def _owner(self) -> str:
        stack = _module_stack()
        names = [s for s in stack if not s.startswith("@")]
        if names:
            return names[-1]
        return "backward (autograd)" if _in_backward() else "(outside modules: inputs, optimizer state, ...)"

    # -- allocator wrapping --------------------------------------------------------------------------------------------
    def _wrap_allocator(self, device: EmulatedGPU, log: DeviceMemoryLog) -> None:
        allocator = device.allocator
        malloc, free = allocator.malloc, allocator.free
        report = self

        def traced_malloc(size_bytes: int, stream_id: int = 0, tag: str = "") -> int:
            handle = malloc(size_bytes, stream_id, tag)
            # a library's workspace is no module's (Note [cuBLAS workspace in the drop-in] in torch_backend/tensor.py)
            owner = "cuBLAS workspaces" if tag.endswith(" workspace") else report._owner()
            log.owner_of[handle] = (owner, size_bytes)
            log.live_by_owner[owner] += size_bytes
            allocated = allocator.memory_allocated()
            if allocated > log.peak_bytes:
                log.peak_bytes = allocated
                log.peak_by_owner = dict(log.live_by_owner)
            return handle

        def traced_free(handle: int) -> None:
            free(handle)
            owned = log.owner_of.pop(handle, None)
            if owned is not None:
                log.live_by_owner[owned[0]] -= owned[1]

        allocator.malloc = traced_malloc  # type: ignore[method-assign]
        allocator.free = traced_free  # type: ignore[method-assign]

    def on_step_boundary(self) -> None:
        """Record memory_allocated on every device (called at each batch fetch: after the previous step)."""
        for device, log in zip(self.devices, self.logs, strict=True):
            log.after_step_bytes.append(device.allocator.memory_allocated())

    def close(self) -> None:
        """Remove the module hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- output ---------------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return per device: peak, persistent (after the last full step), reserved peak and top owners at the peak."""
        out = []
        for device, log in zip(self.devices, self.logs, strict=True):
            allocator = device.allocator
            # The first boundary is before any step ran (inputs only); persistent = after the last complete step.
            after = log.after_step_bytes[1:] or log.after_step_bytes
            top = sorted(log.peak_by_owner.items(), key=lambda kv: -kv[1])[: self.top_n]
            out.append(
                {
                    "device": f"cuda:{device.index}",
                    "gpu": device.spec.key,
                    "capacity_mib": device.memory_limit_bytes / MIB,
                    "peak_allocated_mib": allocator.max_memory_allocated() / MIB,
                    "peak_reserved_mib": allocator.max_memory_reserved() / MIB,
                    "persistent_mib": (after[-1] / MIB) if after else None,
                    "top_at_peak_mib": [{"owner": k, "mib": v / MIB} for k, v in top if v > 0],
                }
            )
        return {"devices": out}

    def render(self) -> None:
        """Print the memory report with rich."""
        from rich.console import Console
        from rich.table import Table

        console = Console(stderr=True)
        for dev in self.to_dict()["devices"]:
            persistent = dev["persistent_mib"]
            console.print(
                f"[bold]gpemu memory report[/] {dev['device']} ({dev['gpu']}, {dev['capacity_mib'] / 1024:.1f} GiB): "
                f"peak allocated {dev['peak_allocated_mib']:.1f} MiB, peak reserved {dev['peak_reserved_mib']:.1f} MiB, "
                f"persistent after a step {'-' if persistent is None else f'{persistent:.1f} MiB'}"
            )
            table = Table(title=f"top allocations at the peak, by module ({dev['device']})")
            table.add_column("module")
            table.add_column("MiB", justify="right")
            table.add_column("% of peak", justify="right")
            for row in dev["top_at_peak_mib"]:
                share = 100 * row["mib"] / dev["peak_allocated_mib"] if dev["peak_allocated_mib"] else 0.0
                table.add_row(row["owner"], f"{row['mib']:.1f}", f"{share:.1f}")
            console.print(table)
