"""Hogwild in the style of pytorch/examples mnist_hogwild: a shared model trained by spawned processes (no gpemu import)."""

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F


def train(rank, model, device):
    torch.manual_seed(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for _ in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(torch.randn(32, 64).to(device)), torch.randint(0, 10, (32,)).to(device))
        loss.backward()
        optimizer.step()
    print(f"rank {rank} trained on {next(model.parameters()).device}", flush=True)


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    model.share_memory()
    processes = [mp.Process(target=train, args=(rank, model, device)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
    print("done", flush=True)
