"""torch.inference_mode on emulated tensors: views of normal tensors, host reads and copies of inference tensors."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt


def test_view_of_a_normal_tensor_inside_inference_mode(emu: gt.Emulation) -> None:
    # torchvision's accuracy(): target[None] on a tensor made outside inference mode, under inference mode
    target = torch.randint(0, 10, (4,), device="cuda")
    logits = torch.randn(4, 10, device="cuda")
    with torch.inference_mode():
        view = target[None]
        _, pred = logits.topk(5, 1, True, True)
        correct = pred.t().eq(view)
        acc = correct[:1].flatten().sum(dtype=torch.float32) * (100.0 / 4)
    assert view.shape == (1, 4) and not view.is_inference()  # a view of a normal tensor stays normal, as on CUDA
    assert correct.shape == (5, 4) and acc.is_inference()


def test_host_reads_of_inference_tensors(emu: gt.Emulation) -> None:
    x = torch.randn(4, device="cuda")
    with torch.inference_mode():
        total = x.sum()
        moved = torch.ones(3).to("cuda", non_blocking=True)  # H2D of a small host tensor: its value is kept
    before = emu.devices[0].stats.d2h_bytes
    assert total.item() == 0.0 and float(total) == 0.0 and total.tolist() == 0.0
    assert bool(total) is False  # `if t:` reaches gpemu as aten.is_nonzero on an inference tensor
    assert total.cpu().device.type == "cpu"
    assert moved.tolist() == [1.0, 1.0, 1.0]
    # five reads of one fp32 scalar: 5 * 4 bytes
    assert emu.devices[0].stats.d2h_bytes - before >= 20
