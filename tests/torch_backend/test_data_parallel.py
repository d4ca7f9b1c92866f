"""DataParallel on emulated GPUs (pytorch/examples imagenet: `DataParallel(model).cuda()`, fed CPU batches in validate)."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt


def test_data_parallel_scatters_a_cpu_batch_as_h2d_copies(emu: gt.Emulation) -> None:
    model = torch.nn.DataParallel(torch.nn.Linear(256, 10)).cuda()
    x = torch.randn(32, 256)  # on the host, as imagenet/main.py's validate() leaves it when --gpu is not given
    before = emu.devices[0].stats.h2d_bytes
    with torch.no_grad():
        out = model(x)
    assert out.is_cuda and out.shape == (32, 10)
    assert emu.devices[0].stats.h2d_bytes - before == 32 * 256 * 4  # the whole batch crossed once: 32768 bytes
    out.sum().item()  # and the copy is on a stream the compute stream waited for: the result can be read


def test_data_parallel_keeps_cuda_inputs_in_place(emu: gt.Emulation) -> None:
    model = torch.nn.DataParallel(torch.nn.Linear(8, 2)).cuda()
    x = torch.randn(4, 8, device="cuda")
    before = emu.devices[0].stats.h2d_bytes
    loss = model(x).sum()
    loss.backward()
    assert emu.devices[0].stats.h2d_bytes == before
    assert model.module.weight.grad is not None and model.module.weight.grad.is_cuda


def test_data_parallel_splits_the_batch_over_two_emulated_gpus() -> None:
    emu = gt.install("v100", count=2)
    try:
        lin = torch.nn.Linear(1024, 1024)
        model = torch.nn.DataParallel(lin).cuda()
        x = torch.randn(64, 1024, device="cuda")
        stats = [d.stats for d in emu.devices]
        out = model(x)
        assert out.device == torch.device("cuda", 0) and out.shape == (64, 1024)
        out.sum().backward()
        torch.cuda.synchronize()
        # each GPU ran the forward matmul on half the batch, so both did compute
        assert stats[0].work_s["kernel"] > 0 and stats[1].work_s["kernel"] > 0
        # replicate: weight + bias (1024*1024 + 1024 floats = 4,198,400 B) copied to GPU 1 once; scatter: half of x
        # (32*1024*4 = 131,072 B); backward moves the output-grad half back and GPU 1's weight/bias grads to GPU 0
        p2p_s = stats[0].work_s.get("p2p", 0.0) + stats[1].work_s.get("p2p", 0.0)
        nvlink_bps = emu.devices[0].spec.nvlink_gbps or emu.devices[0].spec.h2d_pinned_gbps
        assert p2p_s >= (4_198_400 + 131_072) / (nvlink_bps * 1e9)
        assert lin.weight.grad is not None and lin.weight.grad.device == torch.device("cuda", 0)
    finally:
        gt.uninstall()


def test_multi_gpu_data_parallel_is_not_calibrated_to_a_one_gpu_profile() -> None:
    import torchvision

    emu = gt.install("v100", count=2)
    try:
        model = torch.nn.DataParallel(torchvision.models.resnet18()).cuda()  # identifiable as resnet18
        x = torch.randn(4, 3, 224, 224, device="cuda")
        for _ in range(2):
            model(x).sum().backward()
        described = emu.phases.describe()
    finally:
        gt.uninstall()
    assert described["calibrated"] == {} and described["phase_predicted"] == {}
