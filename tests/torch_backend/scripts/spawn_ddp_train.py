"""DDP launched with torch.multiprocessing.spawn, one trainer per GPU, as pytorch/examples imagenet does (no gpemu import)."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(gpu, ngpus, port):
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=ngpus, rank=gpu)
    torch.cuda.set_device(gpu)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4).cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.randn(8, 16).cuda(gpu, non_blocking=True)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trainer {gpu} of {ngpus} on {next(model.parameters()).device}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    ngpus = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus, args=(ngpus, int(sys.argv[1])))
    print("done", flush=True)
