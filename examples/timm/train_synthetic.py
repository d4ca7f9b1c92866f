"""Train a timm model (random init) on synthetic ImageNet-shaped batches, in the style of timm's train.py: timm's
create_model / optimizer / scheduler factories, channels_last, AMP autocast with a GradScaler, label-smoothing loss,
an EMA of the weights, and throughput logging. No downloads."""

import argparse
import time

import timm
import torch
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--opt", default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16", "none"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--model-ema", action="store_true")
    return p.parse_args()


def main():
    args = parse_args()
    device = torch.device("cuda")
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=0.05)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=1, warmup_epochs=0)
    ema = ModelEmaV3(model, decay=0.9998) if args.model_ema else None
    criterion = LabelSmoothingCrossEntropy(smoothing=0.1).to(device)
    amp = args.amp_dtype != "none"
    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp and amp_dtype == torch.float16)

    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    y = torch.randint(0, args.num_classes, (args.batch_size,))
    model.train()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(args.steps):
        inp, target = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if args.channels_last:
            inp = inp.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
            loss = criterion(model(inp), target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if ema is not None:
            ema.update(model, step=step)
        scheduler.step_update(num_updates=step + 1)
        if (step + 1) % 4 == 0:
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / 4
            print(f"step {step + 1} loss {loss.item():.3f} {dt * 1e3:.1f} ms/step "
                  f"{args.batch_size / dt:.0f} img/s lr {optimizer.param_groups[0]['lr']:.2e}")
            t0 = time.perf_counter()
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
