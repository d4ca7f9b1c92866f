"""Session 16 upstream runs of pytorch/examples distributed/ddp-tutorial-series (single_gpu.py, multigpu.py,
multigpu_torchrun.py, multinode.py): every script ran unmodified on one emulated A100 with no gpemu change. These
tests pin the idioms of the newest multinode.py (17f4f9a), which none of the earlier tests covered: it picks its
device and process-group backend through `torch.accelerator` and `torch.distributed.get_default_backend_for_device`,
and resumes from a snapshot loaded with `map_location="cuda"` (no index)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.torch_backend.listeners import KernelLog

import gpemu.torch_backend as gt
from gpemu.cost.roofline import load_params
from gpemu.hardware import get_gpu

# one kernel per op, in launch order, of the tutorial's step: DDP(nn.Linear(20, 1)), batch 32, F.cross_entropy with
# float (soft) targets of shape [32, 1], SGD (foreach); zero_grad sets the gradients to None (no kernel)
STEP_KERNELS = [
    "addmm.default",  # forward
    "_log_softmax.default", "mul.Tensor", "sum.default", "neg.default", "div.Scalar",  # soft-label cross entropy
    "ones_like.default",  # backward's seed gradient
    "div.Scalar", "neg.default", "mul.Tensor", "_log_softmax_backward_data.default",  # the loss backward
    "mm.default", "sum.dim_IntList",  # weight and bias gradients (the input needs none)
    "mul.out", "mul.out",  # DDP's Reducer: each gradient * (1 / world size) into the bucket
    "nccl:all_reduce (1 rank)",  # the one bucket's all-reduce: zero length on one rank
    "copy_.default", "copy_.default",  # the bucket back into the gradients
    "_foreach_add_.List",  # SGD
]


@pytest.fixture
def accelerator_group(emu_a100: gt.Emulation, monkeypatch: pytest.MonkeyPatch) -> Iterator[gt.Emulation]:
    """multinode.py's ddp_setup() under `torchrun --nnodes=1 --nproc_per_node=1` (env://)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29689")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert torch.accelerator.is_available()
    device_type = torch.accelerator.current_accelerator()
    assert device_type == torch.device("cuda")
    torch.accelerator.device_index(0)  # the script calls the context manager without `with`: a no-op, as on CUDA
    backend = dist.get_default_backend_for_device(torch.device(f"{device_type}:0"))
    assert backend == "nccl"  # as on a CUDA machine; the plain CPU run takes the script's gloo branch instead
    dist.init_process_group(backend=backend)
    try:
        yield emu_a100
    finally:
        dist.destroy_process_group()


def test_tutorial_ddp_step_on_the_accelerator_backend(accelerator_group: gt.Emulation) -> None:
    assert dist.get_world_size() == 1 and dist.get_backend() == "gpemu"  # gpemu's one-rank group stands for NCCL
    device = accelerator_group.devices[0]
    model = torch.nn.Linear(20, 1).to(0)
    params = torch.cuda.memory_allocated()
    # weight 20 x 4 B and bias 4 B, each its own block of the allocator's 512 B unit
    assert params == 1024
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    # DDP's one bucket holds a copy of the 21 fp32 parameters, 84 B, rounded up to 512 B
    assert torch.cuda.memory_allocated() - params == 512
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    source, targets = torch.rand(32, 20).pin_memory(), torch.rand(32, 1).pin_memory()  # a pinned DataLoader batch
    spec, fitted = get_gpu("a100"), load_params().shared
    # a kernel this small sits at the model's per-kernel floor: mem_lat_cycles / 1,410 MHz + k0
    # = 9,676.07 cycles / 1.41 GHz + 0.82 us = 7.69 us (the two GEMMs a little above it)
    floor_s = fitted["mem_lat_cycles"] / (spec.load_clock_mhz * 1e6) + fitted["k0"]
    assert floor_s == pytest.approx(7.686e-6, rel=1e-3)
    for _ in range(4):  # later steps replay; the kernels and their prices stay the same
        log = KernelLog()
        remove = device.add_listener(log)
        h2d = device.stats.h2d_bytes
        try:
            s, t = source.to(0), targets.to(0)
            opt.zero_grad()
            F.cross_entropy(ddp(s), t).backward()
            opt.step()
        finally:
            remove()
        # the batch: 32 x 20 x 4 B + 32 x 1 x 4 B = 2,560 + 128 = 2,688 B
        assert device.stats.h2d_bytes - h2d == 2688
        # a replayed phase's first kernel is named "replay <phase>: <op>" (Note [DDP on one rank]: the network
        # inside DDP replays, the Reducer's copies stay per op)
        items = [(n.split(": ", 1)[-1] if n.startswith("replay ") else n, d) for n, d in log.items]
        names = [n for n, _ in items if n != "memcpy HtoD"]
        assert names == STEP_KERNELS
        kernel_s = dict(items)
        # the Reducer's four copies (2 mul.out + 2 copy_) are what DDP adds to the single-GPU step: 4 x 7.69 = 30.7 us
        assert kernel_s["mul.out"] == pytest.approx(floor_s, rel=1e-3)
        assert kernel_s["copy_.default"] == pytest.approx(floor_s, rel=1e-3)
        assert kernel_s["nccl:all_reduce (1 rank)"] == 0.0
        # 16 kernels at the floor and 2 GEMMs at 8.33 us: 16 x 7.686 + 2 x 8.325 = 139.6 us of GPU time per step
        # (the run report's 0.14 ms; single_gpu.py's step without the four copies: 0.11 ms)
        gpu_s = sum(d for n, d in log.items if n != "memcpy HtoD")
        assert gpu_s == pytest.approx(139.6e-6, rel=1e-3)


def test_snapshot_resumes_with_map_location_cuda(accelerator_group: gt.Emulation, tmp_path: Path) -> None:
    # multinode.py @ 17f4f9a: `torch.load(snapshot_path, map_location=str(device))` where device is
    # torch.accelerator.current_accelerator(), i.e. "cuda" without an index
    model = torch.nn.Linear(20, 1).to(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    path = tmp_path / "snapshot.pt"
    torch.save({"MODEL_STATE": ddp.module.state_dict(), "EPOCHS_RUN": 4}, path)
    snapshot = torch.load(path, map_location=str(torch.accelerator.current_accelerator()))
    assert snapshot["EPOCHS_RUN"] == 4
    state = snapshot["MODEL_STATE"]
    assert {k: (v.device, tuple(v.shape)) for k, v in state.items()} == {
        "weight": (torch.device("cuda", 0), (1, 20)), "bias": (torch.device("cuda", 0), (1,))}
    resumed = torch.nn.Linear(20, 1).to(0)
    resumed.load_state_dict(state)  # the resumed Trainer loads it before wrapping the model in DDP
    assert resumed.weight.device == torch.device("cuda", 0)
