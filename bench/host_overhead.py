"""Host CPU cost of emulation: ms of host CPU per training step and us per aten op (resnet18, resnet50, transformer).

Run: .venv/bin/python bench/host_overhead.py [--steps 5] [--batch-size 32]
Prints process CPU time (not wall time: the emulated GPU's waits are excluded) per step and per dispatched op.
The replay path is not implemented yet, so only the per-op path is measured ("replay: n/a").
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


def measure(name: str, steps: int, batch_size: int) -> tuple[float, float, int]:
    """Return (host CPU ms/step, host CPU us/op, ops/step) for one model on an emulated A100."""
    gt.install("a100")
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

            for _ in range(2):
                step()
            torch.cuda.synchronize()
            counter["ops"] = 0
            cpu0 = time.process_time()
            for _ in range(steps):
                step()
            cpu_s = time.process_time() - cpu0
        finally:
            emu_tensor.run_op = orig
        ops = counter["ops"] // steps
        return cpu_s / steps * 1e3, cpu_s / max(1, counter["ops"]) * 1e6, ops
    finally:
        gt.uninstall()


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    print(f"{'model':<12} {'ops/step':>8} {'host ms/step':>13} {'us/op':>7}  {'vs 25 us/op':>12}  replay")
    for name in ("resnet18", "resnet50", "transformer"):
        ms, us, ops = measure(name, args.steps, args.batch_size)
        print(f"{name:<12} {ops:>8} {ms:>13.1f} {us:>7.1f}  {us / 25:>11.1f}x  n/a (not implemented)")


if __name__ == "__main__":
    main()
