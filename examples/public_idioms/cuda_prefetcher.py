"""NVIDIA apex imagenet / timm PrefetchLoader-style input pipeline: uint8 batches from pinned DataLoader memory are
copied and normalised on a side CUDA stream one batch ahead, the compute stream waits on it (wait_stream) and the
batch is handed over with record_stream; channels_last + fp16 autocast + GradScaler; SGD."""

import argparse
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset


class RandomUint8Images(Dataset):
    """Stands in for decoded JPEGs: a small pool of random uint8 images, indexed round-robin."""

    def __init__(self, n, size, pool=16):
        self.n = n
        self.pool = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.pool[i % len(self.pool)], i % 1000


class DataPrefetcher:
    def __init__(self, loader):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()
        self.mean = torch.tensor([0.485 * 255, 0.456 * 255, 0.406 * 255]).cuda().view(1, 3, 1, 1)
        self.std = torch.tensor([0.229 * 255, 0.224 * 255, 0.225 * 255]).cuda().view(1, 3, 1, 1)
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            self.next_input = self.next_input.cuda(non_blocking=True)
            self.next_target = self.next_target.cuda(non_blocking=True)
            self.next_input = self.next_input.float().sub_(self.mean).div_(self.std)

    def next(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        inp, target = self.next_input, self.next_target
        if inp is not None:
            inp.record_stream(torch.cuda.current_stream())
            target.record_stream(torch.cuda.current_stream())
        self.preload()
        return inp, target


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("-j", "--workers", type=int, default=0)
    args = parser.parse_args()

    model = torchvision.models.get_model(args.arch).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    dataset = RandomUint8Images(args.batch_size * args.batches, args.image_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, pin_memory=True)

    prefetcher = DataPrefetcher(loader)
    inp, target = prefetcher.next()
    step, end = 0, time.time()
    while inp is not None:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(inp.contiguous(memory_format=torch.channels_last)), target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % 2 == 0:
            torch.cuda.synchronize()
            print(f"step {step} loss {loss.item():.4f} {(time.time() - end) * 1e3:.1f} ms")
            end = time.time()
        inp, target = prefetcher.next()
        step += 1
    print(f"done {step} steps")


if __name__ == "__main__":
    main()
