"""torch.distributed under emulation: one-rank NCCL groups and DDP (Note [One-rank process groups], Note [DDP on one
rank]); larger worlds fail with a GpemuError naming the limit."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torchvision

import gpemu.torch_backend as gt
from gpemu.errors import GpemuError

ORIGINAL = dist.init_process_group  # at import, before any test installs the emulation
_PORTS = itertools.count(29611)


@pytest.fixture
def group(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch) -> Iterator[gt.Emulation]:
    """An emulation with init_process_group('nccl') done as torchrun --nproc_per_node=1 would (env://)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(next(_PORTS)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("nccl")
    try:
        yield emu
    finally:
        dist.destroy_process_group()


def test_a_one_rank_nccl_group_runs_every_collective_exactly(group: gt.Emulation) -> None:
    assert dist.get_world_size() == 1 and dist.get_rank() == 0 and dist.get_backend() == "gpemu"
    t = torch.tensor([2.5, 4.0], device="cuda")  # a host-known value (Note [Known values])
    dist.all_reduce(t)  # the sum over one rank is the tensor itself
    assert t.tolist() == [2.5, 4.0]
    cpu = torch.arange(3.0)
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    assert cpu.tolist() == [0.0, 1.0, 2.0]
    gathered = [torch.zeros(3)]
    dist.all_gather(gathered, torch.arange(3.0))
    assert gathered[0].tolist() == [0.0, 1.0, 2.0]
    out = torch.empty(4, 8, device="cuda")
    dist.all_gather_into_tensor(out, torch.ones(4, 8, device="cuda"))
    objects: list[object] = [None]
    dist.all_gather_object(objects, {"acc1": 71.5})
    assert objects == [{"acc1": 71.5}]
    dist.broadcast(t, src=0)
    dist.barrier()
    # each collective on an emulated tensor leaves a zero-length NCCL item on its stream (the trace shows it)
    works: list = []
    remove = group.devices[0].add_listener(type("L", (), {"on_work": lambda self, w: works.append(w),
                                                          "on_host_wait": lambda self, *a: None})())
    try:
        dist.all_reduce(t)
    finally:
        remove()
    assert [w.name for w in works] == ["nccl:all_reduce (1 rank)"]


def test_ddp_on_one_rank_trains_with_the_buckets_memory_and_no_host_transfers(group: gt.Emulation) -> None:
    device = group.devices[0]
    model = torchvision.models.resnet18().cuda()
    params_bytes = torch.cuda.memory_allocated()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    # DDP's buckets hold one copy of every trainable parameter: resnet18's 11,689,512 fp32 parameters = 46,758,048
    # bytes, one block rounded up to the allocator's 512-byte unit = 46,758,400
    assert torch.cuda.memory_allocated() - params_bytes == 46_758_400
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (8,), device="cuda")
    h2d, d2h, waits = device.stats.h2d_bytes, device.stats.d2h_bytes, dict(device.stats.host_wait_s)
    names: list[str] = []
    remove = device.add_listener(type("L", (), {"on_work": lambda self, w: names.append(w.name),
                                                "on_host_wait": lambda self, *a: None})())
    try:
        for step in range(3):  # step 1 accumulates under no_sync, as gradient accumulation does
            with ddp.no_sync() if step == 1 else torch.enable_grad():
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            assert isinstance(model.fc.weight.grad, gt.EmuTensor)
            if step != 1:
                opt.step()
                opt.zero_grad()
        torch.cuda.synchronize()
    finally:
        remove()
    # the Reducer's gradient <-> bucket copies stay on the device: no host transfer and no host wait besides the sync
    assert (device.stats.h2d_bytes, device.stats.d2h_bytes) == (h2d, d2h)
    assert set(device.stats.host_wait_s) - set(waits) <= {"device synchronize"}
    # the synced backwards (steps 0 and 2) all-reduce DDP's bucket; the no_sync step does not. torch's DDP starts
    # with one bucket for all parameters and the emulated one keeps it (Note [DDP on one rank]): one per backward
    assert names.count("nccl:all_reduce (1 rank)") == 2


def test_the_network_inside_one_rank_ddp_replays_with_the_same_gpu_time(group: gt.Emulation) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.randn(64, 256, device="cuda")
    stats = group.devices[0].stats
    step_s = []
    for _ in range(5):
        torch.cuda.synchronize()
        before = stats.work_s["kernel"]
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        step_s.append(stats.work_s["kernel"] - before)
    # steps 0-1 record on the per-op path, 2-4 replay the network (Note [DDP on one rank]); the Reducer's bucket
    # copies still run per op, so every step charges the same GPU time
    assert group.replay is not None and group.replay.replayed >= 3
    assert step_s[4] == pytest.approx(step_s[1], rel=1e-6)  # chunk sums vs per-op sums: rounding only


def test_ddp_forwards_print_no_cpp_timer_warning(group: gt.Emulation, capfd: pytest.CaptureFixture[str]) -> None:
    # Note [DDP logger]: DDP samples runtime stats on forwards 1-10; torch's C++ Logger has no timer for the
    # emulated (meta) parameters and warned once per process on stderr. warn_always makes that warn-once fire
    # on every sampled forward, so this test sees it whatever ran before in this process.
    net = torch.nn.Linear(20, 1).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])
    torch.set_warn_always(True)
    try:
        for _ in range(3):
            ddp(torch.randn(32, 20, device="cuda")).sum().backward()
    finally:
        torch.set_warn_always(False)
    assert "Time stats are currently only collected" not in capfd.readouterr().err
    # the real Logger still answers: construction data is there and the module name is the wrapped one
    assert ddp._get_ddp_logging_data()["module_name"] == "Linear"


def test_gradient_as_bucket_view_adds_no_bucket_block(group: gt.Emulation) -> None:
    model = torch.nn.Linear(1024, 1024).cuda()
    before = torch.cuda.memory_allocated()
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    assert torch.cuda.memory_allocated() == before  # the gradients are the buckets on a real GPU
    ddp(torch.randn(4, 1024, device="cuda")).sum().backward()
    assert isinstance(model.weight.grad, gt.EmuTensor)


@pytest.mark.parametrize("backend", [None, "nccl", "cpu:gloo,cuda:nccl"])
def test_a_larger_world_fails_with_the_limit_named(emu: gt.Emulation, backend: str | None) -> None:
    with pytest.raises(GpemuError, match=r"world size 2.*next milestone"):
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:29581", rank=0, world_size=2)
    assert not dist.is_initialized()


def test_gloo_is_left_alone_and_uninstall_restores(emu: gt.Emulation) -> None:
    assert dist.init_process_group is not ORIGINAL  # the patched wrapper
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{next(_PORTS)}", rank=0, world_size=1)
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        with pytest.raises(GpemuError, match="'gloo' process group"):
            torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda())
    finally:
        dist.destroy_process_group()
    gt.uninstall()
    assert dist.init_process_group is ORIGINAL


DDP_SCRIPT = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda(local),
            device_ids=[local])
opt = torch.optim.AdamW(model.parameters())
for step in range(4):
    x = torch.randn(64, 512, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    t = torch.tensor([loss.item()], device="cuda")
    dist.all_reduce(t)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "backend", dist.get_backend())
dist.destroy_process_group()
"""


def test_torchrun_with_one_process_under_gpemu_run(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [sys.executable, "-m", "gpemu", "run", "--gpu", "a100", "--report-json", str(tmp_path / "r.json"), "--",
         str(torchrun), "--standalone", "--nproc_per_node=1", str(script)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 of 1 backend gpemu" in proc.stdout
    import json

    rows = json.loads((tmp_path / "r.json").read_text())["iterations"]
    assert len(rows) >= 3 and all(row["gpu_busy_s"] > 0 for row in rows)  # one per optimizer step (no DataLoader)


def test_a_device_mesh_over_the_one_rank_group(group: gt.Emulation) -> None:
    # DeviceMesh (FSDP2, tensor parallelism) reads the world group's name; a Python process group has no C++ backend
    # to hold it, so torch's _set_group_name did nothing and group_name raised "ProcessGroup name not set"
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (1,))
    assert mesh.size() == 1 and mesh.get_group().group_name == dist.group.WORLD.group_name
    assert dist.group.WORLD.group_name == dist.distributed_c10d._world.pg_names[dist.group.WORLD]


def test_fsdp2_and_fsdp1_run(group: gt.Emulation) -> None:
    # See Note [FSDP2] in patches.py: fully_shard failed deep inside torch (a set_data of parameters it meant to move
    # to the CPU: torch._C._get_accelerator said cpu); its DTensor parameters now say cuda (tests/test_upstream_s15_fsdp2.py)
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    assert torch._C._get_accelerator() == torch.device("cuda")  # as torch.accelerator.current_accelerator() says
    assert fully_shard(torch.nn.Linear(8, 4).cuda()).weight.device == torch.device("cuda", 0)
    model = FullyShardedDataParallel(torch.nn.Linear(8, 4).cuda())  # one rank: NO_SHARD
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    dist.barrier()
