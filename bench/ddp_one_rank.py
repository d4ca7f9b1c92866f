"""Host CPU and GPU time per step of DistributedDataParallel on one emulated rank, per-op path vs replay.

Usage: .venv/bin/python bench/ddp_one_rank.py [--gpu a100] [--model resnet50] [--batch-size 32] [--steps 7]

Runs the same DDP training loop twice in fresh processes (GPEMU_REPLAY=0, then 1) and prints, per step, the emulated
GPU time charged and the host CPU the step took (time.process_time), then the steady-state ratio. Errors, not
verdicts: the host figures depend on the machine and what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, time, torch, torch.distributed as dist, torchvision
import gpemu.torch_backend as gt
gpu, model_name, batch, steps, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
emu = gt.install(gpu)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl")
model = torch.nn.parallel.DistributedDataParallel(torchvision.models.get_model(model_name).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(batch, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (batch,), device="cuda")
stats = emu.devices[0].stats
rows = []
for _ in range(steps):
    torch.cuda.synchronize()
    gpu0, host0 = stats.work_s["kernel"], time.process_time()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    host_s = time.process_time() - host0
    torch.cuda.synchronize()
    rows.append({"gpu_s": stats.work_s["kernel"] - gpu0, "host_s": host_s})
print(json.dumps(rows))
"""


def _run(replay: bool, args: argparse.Namespace, port: int) -> list[dict[str, float]]:
    env = {**os.environ, "GPEMU_REPLAY": "1" if replay else "0"}
    proc = subprocess.run([sys.executable, "-c", CHILD, args.gpu, args.model, str(args.batch_size), str(args.steps),
                           str(port)], capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    """Print per-step host and GPU time for both paths."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="a100")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    per_op, replay = _run(False, args, 29641), _run(True, args, 29642)
    print(f"DDP({args.model}) b{args.batch_size} on one emulated {args.gpu} rank")
    print("step  per-op host ms  per-op GPU ms  replay host ms  replay GPU ms")
    for i, (a, b) in enumerate(zip(per_op, replay, strict=True)):
        print(f"{i:4d}  {1e3 * a['host_s']:14.1f}  {1e3 * a['gpu_s']:13.3f}  {1e3 * b['host_s']:14.1f}  "
              f"{1e3 * b['gpu_s']:13.3f}")
    tail = max(1, args.steps // 2)
    host_a = min(r["host_s"] for r in per_op[-tail:])
    host_b = min(r["host_s"] for r in replay[-tail:])
    print(f"steady state (min of last {tail}): host {1e3 * host_a:.1f} -> {1e3 * host_b:.1f} ms "
          f"({host_a / host_b:.1f}x); GPU {1e3 * per_op[-1]['gpu_s']:.3f} vs {1e3 * replay[-1]['gpu_s']:.3f} ms")


if __name__ == "__main__":
    main()
