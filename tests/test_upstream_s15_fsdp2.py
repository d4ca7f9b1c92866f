"""FSDP2 (`fully_shard`, pytorch/torchtitan's data-parallel idiom) on one emulated GPU (session 15)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import gpemu.torch_backend as gt
from gpemu.torch_backend.tensor import EmuTensor

_PORTS = itertools.count(29811)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[gt.Emulation]:
    """An emulated H100 with init_process_group('nccl') done as torchrun --nproc_per_node=1 would (env://)."""
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(next(_PORTS))), ("RANK", "0"),
                        ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    emu = gt.install("h100")
    try:
        dist.init_process_group("nccl")
        try:
            yield emu
        finally:
            dist.destroy_process_group()
    finally:
        gt.uninstall()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()


@pytest.mark.parametrize("explicit_mesh", [False, True])
def test_fully_shard_parameters_are_dtensors_on_the_emulated_gpu(one_rank: gt.Emulation, explicit_mesh: bool) -> None:
    # Note [FSDP2] in patches.py: torch's C++ DTensor constructor took the meta device behind an EmuTensor, so FSDP's
    # lazy init refused "parameters ... still on meta device" (explicit mesh) and the default mesh raised a GpemuError.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = _model()
    # fp32 parameters in 512-byte blocks: 128*64*4 = 32768, 128*4 = 512, 10*128*4 = 5120, 10*4 = 40 -> 512: 38912
    assert torch.cuda.memory_allocated() == 38912
    kwargs = {"mesh": init_device_mesh("cuda", (1,))} if explicit_mesh else {}
    for layer in (model[0], model[2]):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # one rank: each shard is the whole (unpadded) parameter, copied into FSDP's buffer, the original freed: same bytes
    assert torch.cuda.memory_allocated() == 38912
    for p in model.parameters():
        assert isinstance(p, DTensor) and isinstance(p, torch.nn.Parameter)
        assert p.device == torch.device("cuda", 0) and p.is_cuda and not p.is_meta and p.get_device() == 0
        assert type(p._local_tensor) is EmuTensor  # type: ignore[attr-defined]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(32, 64, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    for p in model.parameters():  # still sharded DTensors on the device after a step, with AdamW state beside them
        assert p.device == torch.device("cuda", 0)
        assert {v.device for v in opt.state[p].values() if v.dim() > 0} == {torch.device("cuda", 0)}


def test_dtensors_over_host_tensors_keep_torch_answers(one_rank: gt.Emulation) -> None:
    # the DTensor properties answer from the local tensor only when it is emulated (Note [FSDP2])
    from torch.distributed.tensor import DTensor, Replicate, init_device_mesh

    mesh = init_device_mesh("cuda", (1,))
    on_gpu = DTensor.from_local(torch.ones(3, device="cuda"), mesh, [Replicate()])
    assert on_gpu.device == torch.device("cuda", 0) and on_gpu.is_cuda and on_gpu.get_device() == 0
    meta = DTensor.from_local(torch.ones(3, device="meta"), mesh, [Replicate()])
    assert meta.device == torch.device("meta") and meta.is_meta and not meta.is_cuda


def test_storage_resize_frees_and_allocates_device_memory() -> None:
    # Note [Storage resize] in tensor.py: FSDP2's free_storage / alloc_storage resize a parameter's storage
    gt.install("h100")
    try:
        x = torch.empty(1 << 20, device="cuda")  # 4 MiB of fp32
        assert torch.cuda.memory_allocated() == 4 << 20
        x.untyped_storage().resize_(0)  # the block goes (it stayed counted, 4 MiB, before)
        assert torch.cuda.memory_allocated() == 0 and x.untyped_storage().size() == 0
        x.untyped_storage().resize_(1000)  # 1000 bytes round up to one 1024-byte block
        assert torch.cuda.memory_allocated() == 1024
        del x
        assert torch.cuda.memory_allocated() == 0
    finally:
        gt.uninstall()


@pytest.mark.parametrize("fsdp", [False, True])
def test_fully_shard_frees_unsharded_parameters_like_a_plain_model(one_rank: gt.Emulation, fsdp: bool) -> None:
    # Note [Storage resize]: after forward and backward FSDP2 resizes each all-gathered parameter's storage to 0; gpemu
    # kept those blocks, so the FSDP2 model held 8,396,800 bytes more than the plain one at every point below
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
    if fsdp:
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    params = 2 * (1024 * 1024 * 4 + 1024 * 4)  # 8,396,800 bytes of fp32 weights and biases
    assert torch.cuda.memory_allocated() == params
    x = torch.randn(8, 1024, device="cuda")  # 32,768 bytes
    y = model(x)
    # + a 32 MiB cuBLAS workspace (33,554,432) + the hidden 8 x 1024 activation (32,768) + the output (32,768)
    assert torch.cuda.memory_allocated() == params + 32768 + 33554432 + 2 * 32768
    y.sum().backward()
    del y
    for p in model.parameters():
        p.grad = None
    after = torch.cuda.memory_allocated()
    assert after == 75538432  # the plain model's (parameters, input and the cuBLAS workspaces: 2 x 33,554,432)
    assert after == params + 32768 + 2 * 33554432


def test_meta_init_then_to_empty_materializes_fsdp2_parameters(one_rank: gt.Emulation) -> None:
    # pytorch/torchtitan's trainer: build on the meta device, fully_shard, `to_empty(device="cuda")`, init_weights.
    # Note [Like-factories of subclasses] in patches.py: to_empty left every DTensor on meta (FSDP's lazy init raised
    # "FSDP parameters should be materialized from meta device"); Note [Philox states] in rng.py: trunc_normal_ of a
    # DTensor then died in DTensor's RNG tracker (a bare AssertionError on the 5056-byte CPU generator state)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    assert torch.cuda.memory_allocated() == 0
    model.to_empty(device="cuda")
    assert torch.cuda.memory_allocated() == 38912  # the same four 512-byte-rounded blocks as a model built on cuda
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.trunc_normal_(p, std=0.02)
    for p in model.parameters():
        assert isinstance(p, DTensor) and p.device == torch.device("cuda", 0) and type(p._local_tensor) is EmuTensor
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    model(torch.randn(32, 64, device="cuda")).square().mean().backward()
    opt.step()
    # parameters, gradients and AdamW's two moments (4 x 38912; its `step` counters are host tensors) and the two
    # 32 MiB cuBLAS workspaces of the forward and the backward streams (2 x 33,554,432): 67,264,512, as a plain model
    assert torch.cuda.memory_allocated() == 4 * 38912 + 2 * 33554432


def test_cuda_rng_state_is_philox_shaped_and_round_trips() -> None:
    # Note [Philox states] in rng.py: a CUDA generator's state is (seed, offset) as two uint64, 16 bytes
    gt.install("h100")
    try:
        torch.cuda.manual_seed(7)
        start = torch.cuda.get_rng_state()
        assert start.dtype == torch.uint8 and start.tolist() == [7] + [0] * 15  # seed 7, offset 0
        first = torch.randperm(20, device="cuda").tolist()  # drawn on the host too (values the host reads)
        moved = torch.cuda.get_rng_state()
        assert moved[8:].view(torch.int64).item() == 4 and torch.cuda.initial_seed() == 7  # a new offset is named
        torch.cuda.set_rng_state(start)
        assert torch.randperm(20, device="cuda").tolist() == first  # the named state replays the same draw
        shifted = start.clone()
        shifted[8:] = torch.tensor([1000], dtype=torch.int64).view(torch.uint8)  # DTensor's tracker adds offsets
        torch.cuda.set_rng_state(shifted)
        other = torch.randperm(20, device="cuda").tolist()
        torch.cuda.set_rng_state(shifted)
        assert torch.randperm(20, device="cuda").tolist() == other != first  # its own stream, deterministic
        assert torch.cuda.initial_seed() == 7
    finally:
        gt.uninstall()
