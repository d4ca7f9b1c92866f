"""Mixed-precision training loop: torch.autocast + GradScaler + AdamW (no gpemu import: runs on real GPUs)."""

import argparse

import torch
import torch.nn as nn


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--no-amp", action="store_true")
    args = p.parse_args(argv)
    device = "cuda"
    model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width),
                          nn.LayerNorm(args.width), nn.Linear(args.width, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=not args.no_amp)
    x = torch.randn(args.batch_size, args.width, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        with torch.autocast("cuda", dtype=torch.float16, enabled=not args.no_amp):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    end.record()
    torch.cuda.synchronize()
    print(f"loss {loss.item():.4f} ms/iter {start.elapsed_time(end) / args.iters:.3f} "
          f"peak_mem_mib {torch.cuda.max_memory_allocated() / 2**20:.1f}")


if __name__ == "__main__":
    main()
