"""A training loop that times its own forward and step with torch.cuda.Event (no gpemu import)."""

import argparse

import torch
import torchvision


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    model = torchvision.models.get_model(args.arch).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    crit = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    fwd_ms, step_ms = [], []
    for i in range(args.warmup + args.iters):
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        out = model(x)
        mid.record()
        loss = crit(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        end.record()
        end.synchronize()
        if i >= args.warmup:
            fwd_ms.append(start.elapsed_time(mid))
            step_ms.append(start.elapsed_time(end))
    print(f"forward_ms {sum(fwd_ms) / len(fwd_ms):.3f} step_ms {sum(step_ms) / len(step_ms):.3f}")


if __name__ == "__main__":
    main()
