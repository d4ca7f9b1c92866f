"""A tiny image classifier trainer written the way timm / HF example trainers are (no gpemu import).

It runs unmodified on a real GPU (or on CPU); tests run it under `gpemu run --gpu a100`. Idioms: the
`torch.device("cuda" if available else "cpu")` switch, TF32/cudnn flags, the model built inside `with torch.device`,
channels_last, old-style `torch.cuda.amp` autocast + GradScaler, NVTX ranges, a device-side shuffling sampler fed by a
cuda torch.Generator, a checkpoint saved every epoch and resumed with `map_location=device`, RNG state round-trips.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler


class SyntheticImages(Dataset):
    """`n` random 3x16x16 images with labels in [0, classes)."""

    def __init__(self, n: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 16, 16, generator=g, device="cpu")
        self.y = torch.randint(0, classes, (n,), generator=g, device="cpu")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class DeviceShuffleSampler(Sampler[int]):
    """Shuffles with a generator that may live on the accelerator (as some LLM/vision trainers do)."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator, device=self.generator.device).tolist())


def make_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", default="out")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(42)
    torch.cuda.manual_seed_all(42)
    use_amp = on_gpu = device.type == "cuda"

    with torch.device(device):
        model = make_model(classes=10)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    os.makedirs(args.output, exist_ok=True)
    ckpt_path = os.path.join(args.output, "last.pth")
    start_epoch = 0
    if args.resume and os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        if device.type == "cuda":
            torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu())
        start_epoch = ckpt["epoch"] + 1
        print(f"resumed from {ckpt_path} at epoch {start_epoch}")

    data = SyntheticImages(64, 10)
    generator = torch.Generator(device=device)
    generator.manual_seed(1234)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DeviceShuffleSampler(len(data), generator),
                        pin_memory=device.type == "cuda", drop_last=True)
    print(f"device {device}, params on {next(model.parameters()).device}, "
          f"{torch.cuda.get_device_name(0) if use_amp else 'cpu'}")

    for epoch in range(start_epoch, args.epochs):
        model.train()
        seen = 0
        for x, y in loader:
            torch.cuda.nvtx.range_push("step")
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.cuda.amp.autocast(enabled=use_amp):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            torch.cuda.nvtx.range_pop()
            seen += x.shape[0]
        loss_value = loss.detach().to("cpu", non_blocking=True)
        if on_gpu:
            torch.cuda.current_stream().synchronize()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                    "epoch": epoch, "cuda_rng": torch.cuda.get_rng_state() if on_gpu else None}, ckpt_path)
        print(f"epoch {epoch} samples {seen} loss {float(loss_value):.3f}")

    model.eval()
    with torch.no_grad(), torch.cuda.amp.autocast(enabled=use_amp):
        x, y = next(iter(loader))
        acc = (model(x.to(device)).argmax(1) == y.to(device)).float().mean().item()
    peak_mib = torch.cuda.max_memory_allocated() / 2**20 if use_amp else 0.0
    if on_gpu:
        torch.cuda.empty_cache()
    print(f"done acc {acc:.2f} peak_mem_mib {peak_mib:.2f}")


if __name__ == "__main__":
    main()
