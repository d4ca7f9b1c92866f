"""torchvision references/classification-style training: MetricLogger, EMA, MixUp/CutMix, legacy AMP, checkpoints."""

import argparse
import datetime
import os
import time
from collections import defaultdict, deque

import torch
import torch.distributed as dist
import torch.utils.data
import torchvision
from torch import nn
from torch.utils.data.dataloader import default_collate
from torchvision.transforms import v2


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


class SmoothedValue:
    """Windowed and global averages of a series."""

    def __init__(self, window_size=20, fmt="{median:.4f} ({global_avg:.4f})"):
        self.deque = deque(maxlen=window_size)
        self.total, self.count, self.fmt = 0.0, 0, fmt

    def update(self, value, n=1):
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self):
        t = torch.tensor([self.count, self.total], dtype=torch.float64, device="cuda")
        if not is_dist_avail_and_initialized():
            return
        dist.barrier()
        dist.all_reduce(t)
        self.count, self.total = int(t[0].item()), t[1].item()

    @property
    def median(self):
        return torch.tensor(list(self.deque)).median().item()

    @property
    def avg(self):
        return torch.tensor(list(self.deque), dtype=torch.float32).mean().item()

    @property
    def global_avg(self):
        return self.total / max(self.count, 1)

    def __str__(self):
        return self.fmt.format(median=self.median, avg=self.avg, global_avg=self.global_avg)


class MetricLogger:
    def __init__(self, delimiter="  "):
        self.meters = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].update(v)

    def synchronize_between_processes(self):
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def log_every(self, iterable, print_freq, header=""):
        start = time.time()
        for i, obj in enumerate(iterable):
            yield obj
            if i % print_freq == 0 or i == len(iterable) - 1:
                if torch.cuda.is_available():
                    mb = torch.cuda.max_memory_allocated() / (1024.0 * 1024.0)
                    meters = self.delimiter.join(f"{k}: {v}" for k, v in self.meters.items())
                    print(f"{header} [{i}/{len(iterable)}] {meters} max mem: {mb:.0f}")
        print(f"{header} Total time: {datetime.timedelta(seconds=int(time.time() - start))}")


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """EMA of parameters and buffers, as torchvision's reference keeps it."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_param, param, num_averaged):
            return decay * avg_param + (1 - decay) * param

        super().__init__(model, device, ema_avg, use_buffers=True)


def accuracy(output, target, topk=(1,)):
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        if target.ndim == 2:
            target = target.max(dim=1)[1]
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])
        return [correct[:k].flatten().sum(dtype=torch.float32) * (100.0 / batch_size) for k in topk]


def set_weight_decay(model, weight_decay, norm_weight_decay=0.0):
    norm_classes = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)
    decay, no_decay = [], []
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.requires_grad:
                (no_decay if isinstance(module, norm_classes) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": norm_weight_decay}]


def train_one_epoch(model, criterion, optimizer, loader, device, epoch, args, model_ema=None, scaler=None):
    model.train()
    logger = MetricLogger()
    logger.meters["lr"] = SmoothedValue(window_size=1, fmt="{median:.6f}")
    for i, (image, target) in enumerate(logger.log_every(loader, args.print_freq, f"Epoch: [{epoch}]")):
        image, target = image.to(device), target.to(device)
        with torch.cuda.amp.autocast(enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if model_ema and i % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch < args.lr_warmup_epochs:
                model_ema.n_averaged.fill_(0)  # reset EMA during warmup
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        logger.update(loss=loss.item(), lr=optimizer.param_groups[0]["lr"])
        logger.meters["acc1"].update(acc1.item(), n=image.shape[0])
        logger.meters["acc5"].update(acc5.item(), n=image.shape[0])
        logger.meters["img/s"].update(image.shape[0] / 0.01)


def evaluate(model, criterion, loader, device, header="Test"):
    model.eval()
    logger = MetricLogger()
    seen = 0
    with torch.inference_mode():
        for image, target in logger.log_every(loader, 100, header):
            image, target = image.to(device, non_blocking=True), target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            logger.update(loss=loss.item())
            logger.meters["acc1"].update(acc1.item(), n=image.shape[0])
            seen += image.shape[0]
    logger.synchronize_between_processes()
    print(f"{header} Acc@1 {logger.meters['acc1'].global_avg:.3f} evaluated {seen}")
    return logger.meters["acc1"].global_avg


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--mixup-alpha", type=float, default=0.2)
    p.add_argument("--cutmix-alpha", type=float, default=1.0)
    p.add_argument("--lr-warmup-epochs", type=int, default=1)
    p.add_argument("--clip-grad-norm", type=float, default=1.0)
    p.add_argument("--model-ema-steps", type=int, default=1)
    p.add_argument("--model-ema-decay", type=float, default=0.99998)
    p.add_argument("--print-freq", type=int, default=1)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--use-deterministic-algorithms", action="store_true")
    p.add_argument("--output-dir", default=".")
    p.add_argument("--resume", default="")
    args = p.parse_args()

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise SystemExit("this example runs single-process")
    print("Not using distributed mode")
    device = torch.device("cuda")
    if args.use_deterministic_algorithms:
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    else:
        torch.backends.cudnn.benchmark = True

    size = (3, args.image_size, args.image_size)
    train_set = torchvision.datasets.FakeData(args.num_samples, size, args.num_classes, transform=v2.Compose(
        [v2.PILToTensor(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float, scale=True),
         v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]))
    val_set = torchvision.datasets.FakeData(args.num_samples, size, args.num_classes, transform=v2.Compose(
        [v2.PILToTensor(), v2.ToDtype(torch.float, scale=True)]), random_offset=7)
    mix = v2.RandomChoice([v2.MixUp(alpha=args.mixup_alpha, num_classes=args.num_classes),
                           v2.CutMix(alpha=args.cutmix_alpha, num_classes=args.num_classes)])

    def collate_fn(batch):
        return mix(*default_collate(batch))

    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                                               num_workers=args.workers, pin_memory=True, collate_fn=collate_fn,
                                               drop_last=True)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size, num_workers=args.workers,
                                             pin_memory=True)

    model = torchvision.models.get_model(args.model, weights=None, num_classes=args.num_classes)
    model.to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(set_weight_decay(model, 1e-4), lr=args.lr, momentum=0.9, nesterov=True)
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    main_sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs - args.lr_warmup_epochs)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=args.lr_warmup_epochs)
    lr_scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, main_sched],
                                                         milestones=[args.lr_warmup_epochs])
    model_without_ddp = model
    adjust = args.batch_size * args.model_ema_steps / args.epochs
    alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
    model_ema = ExponentialMovingAverage(model_without_ddp, device=device, decay=1.0 - alpha)

    start_epoch = 0
    if args.resume:
        ck = torch.load(args.resume, map_location="cpu", weights_only=False)
        model_without_ddp.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        lr_scheduler.load_state_dict(ck["lr_scheduler"])
        model_ema.load_state_dict(ck["model_ema"])
        if scaler:
            scaler.load_state_dict(ck["scaler"])
        start_epoch = ck["epoch"] + 1

    start = time.time()
    for epoch in range(start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, train_loader, device, epoch, args, model_ema, scaler)
        lr_scheduler.step()
        evaluate(model, criterion, val_loader, device)
        evaluate(model_ema, criterion, val_loader, device, header="Test: EMA")
        ck = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
              "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch, "args": args,
              "model_ema": model_ema.state_dict()}
        if scaler:
            ck["scaler"] = scaler.state_dict()
        torch.save(ck, os.path.join(args.output_dir, "checkpoint.pth"))
    print(f"Training time {datetime.timedelta(seconds=int(time.time() - start))}")


if __name__ == "__main__":
    main()
