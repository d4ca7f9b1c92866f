"""Eager against CUDA-graphed steps on an emulated GPU: what graph replay changes in the timeline.

Usage: .venv/bin/python bench/cuda_graphs.py [--gpu h100] [--steps 20]

Two host-bound workloads, each run eagerly and through CUDA graphs (Note [CUDA graphs] in gpemu/device/graph.py):
  mlp     a 16-layer Linear(512) + ReLU network, batch 16, fwd + bwd + SGD; graphed by make_graphed_callables
  r18inf  torchvision resnet18 inference at batch 1, the whole forward captured with torch.cuda.graph
  r18cmp  torchvision resnet18 training at batch 8: eager, torch.compile default, mode="reduce-overhead"
It prints, per workload and mode, the wall time per step on the emulated timeline, the GPU busy time per step, the
GPU's share of the wall time, and the graph's captured kernel count. Eager wall time is bound by this machine's own
dispatch (the emulator's per-op host time, or module replay's), not by a prediction of PyTorch's dispatch on the
target host, so the eager / graphed ratio is this host's, not a GPU's: what carries over is the graphed side, GPU
bound at the captured kernels' predicted durations plus one launch latency per replay. No real-GPU graph timing has
been measured for this project yet (no figure here is validated against a card).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import gpemu.torch_backend as gt

console = Console(width=140)


def _timed(emu: gt.Emulation, step: Callable[[], None], steps: int) -> tuple[float, float]:
    """Return (wall s, GPU busy s) per step on the emulated timeline, after 3 warm-up steps."""
    dev = emu.devices[0]
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0, b0 = dev.clock.now(), dev.busy_s()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (dev.clock.now() - t0) / steps, (dev.busy_s() - b0) / steps


def mlp(emu: gt.Emulation, steps: int) -> list[tuple[str, float, float, int]]:
    """Return (mode, wall s, busy s, graph kernels) rows of the MLP training step, eager and graphed."""
    model = nn.Sequential(*[m for _ in range(16) for m in (nn.Linear(512, 512), nn.ReLU())]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 512, device="cuda")

    def make_step(net: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        return step

    eager = _timed(emu, make_step(model), steps)
    graphed_net = torch.cuda.make_graphed_callables(model, (x,))
    graphed = _timed(emu, make_step(graphed_net), steps)
    return [("eager", *eager, 0), ("make_graphed_callables", *graphed, -1)]


def r18_inference(emu: gt.Emulation, steps: int) -> list[tuple[str, float, float, int]]:
    """Return rows of resnet18 inference at batch 1, eager and as one captured forward."""
    import torchvision

    model = torchvision.models.resnet18().cuda().eval()
    static_x = torch.randn(1, 3, 224, 224, device="cuda")

    def forward() -> None:
        model(static_x)

    with torch.no_grad():
        eager = _timed(emu, forward, steps)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(static_x)
        graphed = _timed(emu, g.replay, steps)
    kernels = g._capture.kernels if g._capture is not None else 0
    return [("eager", *eager, 0), ("torch.cuda.graph", *graphed, kernels)]


def r18_compiled(emu: gt.Emulation, steps: int) -> list[tuple[str, float, float, int]]:
    """Return rows of resnet18 training at batch 8: eager, torch.compile (default mode) and mode="reduce-overhead"
    (Note [Compiled with CUDA graphs]); each mode on a fresh model, the emulation shared."""
    import torchvision

    rows = []
    for mode in ("eager", "default", "reduce-overhead"):
        model = torchvision.models.resnet18().cuda()
        net = model if mode == "eager" else torch.compile(model, mode=mode)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (8,), device="cuda")

        def step(net: nn.Module = net, opt: torch.optim.Optimizer = opt, x: torch.Tensor = x,
                 y: torch.Tensor = y) -> None:
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()

        rows.append((mode if mode == "eager" else f"torch.compile {mode}", *_timed(emu, step, steps), 0))
    return rows


def main() -> None:
    """Run both workloads eager and graphed; print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    t0 = time.perf_counter()
    table = Table(title=f"CUDA graphs on an emulated {args.gpu} (timeline of this host's run)")
    for col in ("workload", "mode", "wall ms/step", "GPU busy ms/step", "GPU share", "graph kernels"):
        table.add_column(col, justify="left" if col in ("workload", "mode") else "right")
    for name, fn in (("mlp b16 train", mlp), ("resnet18 b1 infer", r18_inference), ("resnet18 b8 train", r18_compiled)):
        emu = gt.install(args.gpu)
        try:
            rows = fn(emu, args.steps)
        finally:
            gt.uninstall()
        for mode, wall_s, busy_s, kernels in rows:
            table.add_row(name, mode, f"{wall_s * 1e3:.3f}", f"{busy_s * 1e3:.3f}", f"{busy_s / wall_s:.0%}",
                          "-" if kernels == 0 else ("fwd+bwd" if kernels < 0 else str(kernels)))
    console.print(table)
    console.print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
