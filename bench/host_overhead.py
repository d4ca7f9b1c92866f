"""Host CPU cost of emulation: ms of host CPU per training step and us per aten op (resnet18, resnet50, transformer).

Run: .venv/bin/python bench/host_overhead.py [--steps 5] [--batch-size 32]
Prints process CPU time (not wall time: the emulated GPU's waits are excluded) per step and per aten op, first on the
per-op path (replay=False), then with the whole-module replay path (replay=True). With replay, "us/op" is the step's
CPU divided by the ops the per-op step dispatches (the ops the step stands for); "ops" is what it still dispatches
(loss, optimizer, zero_grad, AccumulateGrad outside the replayed module).
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision

import gpemu.torch_backend as gt
from gpemu.torch_backend import tensor as emu_tensor


def _transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    return torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 6), torch.nn.Linear(512, 1000))


def measure(name: str, steps: int, batch_size: int, replay: bool) -> tuple[float, int]:
    """Return (host CPU ms/step, aten ops dispatched per step) for one model on an emulated A100."""
    emu = gt.install("a100", replay=replay)
    try:
        model = (torchvision.models.get_model(name) if name != "transformer" else _transformer()).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        shape = (batch_size, 3, 224, 224) if name != "transformer" else (batch_size, 128, 512)
        x = torch.randn(*shape, device="cuda")
        counter = {"ops": 0}
        orig = emu_tensor.run_op

        def counting(func, args, kwargs):  # type: ignore[no-untyped-def]
            counter["ops"] += 1
            return orig(func, args, kwargs)

        emu_tensor.run_op = counting
        try:
            def step() -> None:
                out = model(x)
                out.float().mean().backward()
                opt.step()
                opt.zero_grad()

            for _ in range(3):  # steps 1-2 record the replay; step 3 is the first replayed
                step()
            torch.cuda.synchronize()
            counter["ops"] = 0
            cpu0 = time.process_time()
            for _ in range(steps):
                step()
            cpu_s = time.process_time() - cpu0
        finally:
            emu_tensor.run_op = orig
        if replay:
            assert emu.replay is not None and emu.replay.replayed >= steps, "replay did not engage"
        return cpu_s / steps * 1e3, counter["ops"] // steps
    finally:
        gt.uninstall()


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    print(f"{'model':<12} {'ops/step':>8} | {'per-op ms/step':>14} {'us/op':>6} | {'replay ms/step':>14} {'us/op':>6}"
          f" {'ops':>5} {'speedup':>8}")
    for name in ("resnet18", "resnet50", "transformer"):
        ms, ops = measure(name, args.steps, args.batch_size, replay=False)
        rms, rops = measure(name, args.steps, args.batch_size, replay=True)
        print(f"{name:<12} {ops:>8} | {ms:>14.1f} {ms / ops * 1e3:>6.1f} | {rms:>14.1f} {rms / ops * 1e3:>6.1f}"
              f" {rops:>5} {ms / rms:>7.1f}x")
    print("targets: <= 25 us/op, <= 2 ms/step with replay")

if __name__ == "__main__":
    main()
