"""Idioms of facebookresearch/dino's main_dino.py (multi-crop self-distillation) under the drop-in emulation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

import gpemu.torch_backend as gt
from gpemu.cost.predict import predict_phase


class _MultiCrop(torch.nn.Module):
    """DINO's utils.MultiCropWrapper, called with the list of crops: one backbone call per pair (the 2 global crops,
    then 2 local crops; a SimCLR-style second view when the pair has the first's size)."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([self.backbone(torch.cat(crops[i:i + 2])) for i in range(0, len(crops), 2)])


def _dino_steps(local_size: int, predict: bool, replay: bool,
                monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """(forward, loss + backward + step) GPU seconds of 4 multi-crop steps of resnet18: 2 global 224x224 crops, then 2
    local crops of `local_size`, one image each."""
    monkeypatch.setenv("GPEMU_PHASE_PREDICT", "1" if predict else "0")
    gt.install("h100", replay=replay)
    try:
        stats = gt.current_emulation().devices[0].stats
        student = _MultiCrop(torchvision.models.resnet18()).cuda()
        opt = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
        crops = [torch.randn(1, 3, s, s, device="cuda") for s in (224, 224, local_size, local_size)]
        steps = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            out = student(crops)
            torch.cuda.synchronize()
            t1 = stats.work_s["kernel"]
            opt.zero_grad()
            out.float().mean().backward()
            opt.step()
            torch.cuda.synchronize()
            steps.append((t1 - t0, stats.work_s["kernel"] - t1))
        return steps
    finally:
        gt.uninstall()


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("local_size", [96, 224])
def test_multi_crop_steps_keep_the_backward_per_op(local_size: int, replay: bool, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Several forwards in a step]: the backbone's first call (the global crops, resnet18 at batch 2: identified)
    # opened a backward phase that held only the next crops' `torch.cat`. With 96x96 local crops (not the profiled
    # input: per op) that cat was charged the whole backward prediction from the second step on; with 224x224 ones (a
    # SimCLR-style second view, the same step key) the real backward was scaled by prediction / (one cat's price).
    # H100, spec-model path: forward prediction 5.06 ms, backward 9.53 ms. Before: the 96-crop step's forward read
    # 15.14 ms (1.15 per op), the two-view step's loss + backward + SGD 2,589 ms (1.83 per op)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows anywhere: the spec-model path
    monkeypatch.setenv("GPEMU_BUILTIN_PROFILES", "0")  # not the shipped H100 profile either
    forward = predict_phase("h100", "resnet18", "forward", 2).value
    per_op = _dino_steps(local_size, predict=False, replay=replay, monkeypatch=monkeypatch)
    predicted = _dino_steps(local_size, predict=True, replay=replay, monkeypatch=monkeypatch)
    fwd, rest = predicted[3]
    # loss + backward of both calls + SGD: per op, as without phase predictions
    assert rest == pytest.approx(per_op[3][1], rel=1e-9)
    # each 224x224 call is a profiled forward and takes the prediction in place of its per-op sum; the 96x96 call and
    # the cats stay per op: predicted - per-op = (224 calls) x (prediction - one call's per-op sum), so between 0
    # and that many predictions (now 5.62 - 1.15 = 4.47 ms for one call, 10.15 - 1.20 = 8.95 ms for two)
    calls_224 = 1 if local_size == 96 else 2
    assert 0 < fwd - per_op[3][0] < calls_224 * forward
    assert predicted[2] == pytest.approx(predicted[3], rel=1e-9)  # steady from the third step


@pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm"])
def test_a_weight_normed_layer_keeps_its_parameters_when_moved(norm: str, emu: gt.Emulation) -> None:
    # Note [Weight-norm caches]: DINOHead's last layer is `weight_norm(nn.Linear(256, out_dim, bias=False))`, built on
    # the CPU and moved with `.cuda()`. The hook's cached `weight` held weight_g / weight_v in its autograd node, the
    # swap refused, gpemu warned and the moved layer got new Parameter objects: an optimizer built before the move kept
    # stepping the CPU tensors (spectral_norm's `weight_orig` the same, once a CPU forward has cached its weight)
    layer = torch.nn.Linear(256, 1024, bias=False)
    layer = torch.nn.utils.weight_norm(layer) if norm == "weight_norm" else torch.nn.utils.spectral_norm(layer)
    if norm == "spectral_norm":
        layer(torch.randn(2, 256))  # its cached weight gets a graph from the first forward
    params = list(layer.parameters())
    opt = torch.optim.SGD(params, lr=0.1)  # built before the move, as on a GPU it may be
    layer.cuda()
    assert [p is q for p, q in zip(layer.parameters(), params, strict=True)] == [True] * len(params)
    assert all(p.is_cuda for p in opt.param_groups[0]["params"])
    # weight_v (weight_orig) is 1024 x 256 fp32 = 1,048,576 bytes, weight_g 1024 x 1 fp32 = 4,096 bytes (spectral_norm
    # instead has its u and v buffers, 1024 + 256 floats = 5,120 bytes): all on the device, nothing counted twice
    expected = 1_048_576 + (5_120 if norm == "spectral_norm" else 4_096)
    assert torch.cuda.memory_allocated() == expected
    layer(torch.randn(8, 256, device="cuda")).sum().backward()  # the hook recomputes the weight on the device
    opt.step()
    assert layer.weight.is_cuda and all(p.grad is not None and p.grad.is_cuda for p in params)


def test_a_grad_enabled_forward_only_loop_is_charged_no_backward(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Several forwards in a step]: evaluation without `torch.no_grad()` (DINO's teacher runs in grad mode too)
    # calls the model again and again with no backward pass between; each call's "backward phase" (here one argmax)
    # took the backward prediction. H100, spec-model path, resnet18 at batch 2: forward prediction 5.06 ms, backward
    # 9.53 ms; each call read 14.59 ms before, now 5.07 ms (the forward prediction and one argmax at its per-op price)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("GPEMU_BUILTIN_PROFILES", "0")  # the spec-model path, as predict_phase(db=None) below
    forward = predict_phase("h100", "resnet18", "forward", 2).value
    gt.install("h100", replay=False)
    try:
        stats = gt.current_emulation().devices[0].stats
        model = torchvision.models.resnet18().cuda().eval()
        x = torch.randn(2, 3, 224, 224, device="cuda")
        calls = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            model(x).argmax(1)
            torch.cuda.synchronize()
            calls.append(stats.work_s["kernel"] - t0)
    finally:
        gt.uninstall()
    assert calls[3] == pytest.approx(calls[1], rel=1e-9)
    assert forward < calls[3] < forward + 50e-6  # + one argmax over 2 x 1000 logits, a few microseconds
