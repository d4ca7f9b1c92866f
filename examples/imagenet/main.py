"""ImageNet training in the style of pytorch/examples imagenet/main.py (trimmed; no gpemu import: runs on real GPUs)."""

import argparse
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    p.add_argument("data", nargs="?", default="", help="path to dataset (ImageFolder with train/)")
    p.add_argument("-a", "--arch", default="resnet18", choices=sorted(n for n in models.list_models(module=models)))
    p.add_argument("-j", "--workers", default=4, type=int)
    p.add_argument("--epochs", default=1, type=int)
    p.add_argument("--iters", default=0, type=int, help="stop each epoch after this many iterations (0: all)")
    p.add_argument("-b", "--batch-size", default=256, type=int)
    p.add_argument("--lr", default=0.1, type=float)
    p.add_argument("--momentum", default=0.9, type=float)
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    p.add_argument("-p", "--print-freq", default=10, type=int)
    p.add_argument("--dummy", action="store_true", help="use fake data to benchmark")
    p.add_argument("--image-size", default=224, type=int)
    p.add_argument("--checkpoint", default="checkpoint.pth.tar")
    return p.parse_args(argv)


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def main(argv=None):
    args = parse_args(argv)
    if torch.accelerator.is_available():
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    print(f"=> using device {device} ({torch.accelerator.device_count()} visible), arch {args.arch}")
    model = models.__dict__[args.arch]()
    if device.type == "cuda":
        model = torch.nn.DataParallel(model).cuda()
    else:
        model = model.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    torch.backends.cudnn.benchmark = True

    size = args.image_size
    if args.dummy:
        train_dataset = datasets.FakeData(max(args.batch_size * max(args.iters, 1), 1), (3, size, size), 1000,
                                          transforms.ToTensor())
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(
            f"{args.data}/train",
            transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(), normalize]),
        )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True,
                                               num_workers=args.workers, pin_memory=True)

    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            if args.iters and i >= args.iters:
                break
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % args.print_freq == 0:
                print(f"Epoch [{epoch}][{i}] time {time.time() - end:.3f} loss {loss.item():.4f} "
                      f"acc@1 {acc1[0]:.2f} acc@5 {acc5[0]:.2f}", flush=True)
            end = time.time()
        torch.save({"epoch": epoch + 1, "arch": args.arch, "state_dict": model.state_dict(),
                    "optimizer": optimizer.state_dict()}, args.checkpoint)
    print("done")


if __name__ == "__main__":
    main()
