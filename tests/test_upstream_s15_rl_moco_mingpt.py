"""Session 15 upstream runs: facebookresearch/moco's main_moco.py (MoCo v2, one-rank DDP via mp.spawn), each idiom
reproduced in a few lines. (pytorch/examples reinforcement_learning never moves to cuda: nothing to test.)"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import gpemu.torch_backend as gt

_PORTS = itertools.count(29671)


class _Queue(torch.nn.Module):
    """MoCo's negatives queue: `ptr = int(self.queue_ptr)`, write the keys at ptr, `self.queue_ptr[0] = ptr'`."""

    def __init__(self, dim: int = 8, k: int = 64) -> None:
        super().__init__()
        self.k = k
        self.register_buffer("queue", torch.randn(dim, k))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> int:
        ptr = int(self.queue_ptr)
        self.queue[:, ptr : ptr + keys.shape[0]] = keys.T
        self.queue_ptr[0] = (ptr + keys.shape[0]) % self.k
        return ptr


def test_a_counter_written_by_index_reads_back_as_written(emu_a100: gt.Emulation) -> None:
    # Note [Writes through views]: `self.queue_ptr[0] = n` is select + copy_ of a number torch builds on the
    # emulated tensor's meta device (its value lost there); the buffer was then forgotten as modified and every
    # `int(self.queue_ptr)` read 0. A GPU reads 0, 16, 32, 48, then (64 % 64 =) 0 again with batch 16, K = 64
    q = _Queue().cuda()
    ptrs = [q.enqueue(torch.randn(16, 8, device="cuda")) for _ in range(6)]
    assert ptrs == [0, 16, 32, 48, 0, 16]
    assert int(q.queue_ptr) == 32
    # slices and several elements: [0, 0, 0, 0] -> [0, 7, 7, 0] -> [0, 7, 7, 5]
    t = torch.zeros(4, dtype=torch.long, device="cuda")
    t[1:3] = 7
    t[-1] = 5
    assert t.tolist() == [0, 7, 7, 5]


def test_in_place_writes_to_a_view_reach_the_known_base(emu_a100: gt.Emulation) -> None:
    # Note [Writes through views]: the view's new value is written into the base's: [0, 0] -> [0, 9] -> [3, 9]
    ptr = torch.zeros(2, dtype=torch.long).cuda()
    ptr[1].copy_(torch.tensor(9))  # a 0-dim host tensor: run as fill_ on the device
    assert ptr.tolist() == [0, 9]
    ptr[0].fill_(3)
    assert ptr.tolist() == [3, 9]
    assert int(ptr[1]) == 9


def test_a_one_rank_ddp_keeps_known_buffer_values(emu_a100: gt.Emulation, monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Buffers through DDP's initial broadcast]: DDP's constructor broadcasts (flatten, broadcast, copy back)
    # the module's state from rank 0; on one rank that is the same values, but the copy back made gpemu forget the
    # queue pointer's value (MoCo's run read 0 at every step: its 16-key batches all overwrote queue[:, 0:16])
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(next(_PORTS)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("nccl")
    try:
        q = _Queue().cuda()
        q.queue_ptr[0] = 48
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(q, torch.nn.Linear(2, 2)).cuda(),
                                                        device_ids=[0])
        assert int(ddp.module[0].queue_ptr) == 48
        # 48 -> (48 + 16) % 64 = 0 -> 16
        assert [q.enqueue(torch.randn(16, 8, device="cuda")) for _ in range(3)] == [48, 0, 16]
    finally:
        dist.destroy_process_group()
