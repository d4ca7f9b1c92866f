"""Session 16 upstream runs: torchvision references/classification/train_quantization.py (eager QAT of
mobilenet_v2 on the emulated GPU, CPU conversion at the end of each epoch), each idiom reproduced in a few lines."""

from __future__ import annotations

import copy
import warnings

import torch

import gpemu.torch_backend as gt


def _fake_quant() -> torch.nn.Module:
    """The activation fake-quant of the default qnnpack QAT qconfig: FusedMovingAvgObsFakeQuantize (quint8, 0..255)."""
    return torch.ao.quantization.get_default_qat_qconfig("qnnpack").activation()


def test_fused_observer_buffers_are_no_longer_known_after_an_update(emu_a100: gt.Emulation) -> None:
    # Note [Writes without a version bump]: the observer's buffers are built on the host (min inf, max -inf, scale 1,
    # zero point 0) and copied to the device, so gpemu knows them; `_fused_moving_avg_obs_fq_helper` writes them in
    # place without a version bump, and before the fix they read inf / -inf / 1 / 0 after every step (convert then
    # took the "must run observer" default). Now they read as computed values: 0 (the Values default)
    fq = _fake_quant().cuda()
    obs = fq.activation_post_process
    assert obs.min_val.item() == float("inf") and obs.max_val.item() == float("-inf")  # not yet observed: known
    x = torch.nn.Linear(64, 32).cuda()(torch.randn(16, 64, device="cuda"))
    y = fq(x)
    assert y.shape == (16, 32) and y.device.type == "cuda"
    assert obs.min_val.item() == 0.0 and obs.max_val.item() == 0.0
    assert fq.scale.item() == 0.0 and fq.zero_point.item() == 0
    # QAT's evaluation runs in inference mode, where the composite op itself reaches gpemu: same answer
    fq2 = _fake_quant().cuda()
    with torch.inference_mode():
        fq2(x)
    assert fq2.activation_post_process.min_val.item() == 0.0 and fq2.scale.item() == 0.0


def test_fused_fake_quant_is_priced_as_one_elementwise_kernel(emu_a100: gt.Emulation) -> None:
    # a 256 x 1024 fp32 activation: the fused op reads 1 MiB and writes 1 MiB plus a 256 KiB bool mask, ~2.25 MiB,
    # 1.5 us at the A100's 1,555 GB/s; one kernel, priced above that floor and well below a GEMM's 37.8 us here
    x = torch.nn.Linear(1024, 1024).cuda()(torch.randn(256, 1024, device="cuda"))
    stats = emu_a100.devices[0].stats
    count, before = sum(stats.work_count.values()), stats.work_s["kernel"]
    fq = _fake_quant().cuda()
    fq(x)
    charged = stats.work_s["kernel"] - before
    assert sum(stats.work_count.values()) - count >= 1
    assert 1.5e-6 < charged < 20e-6


def test_a_model_copied_in_inference_mode_moves_to_the_cpu(emu_a100: gt.Emulation) -> None:
    # Note [Moves off the device in inference mode]: QAT copies the model inside `torch.inference_mode()` and moves
    # the copy to the CPU for convert. Before the fix every parameter of the copy (4 here: conv and BN weight and
    # bias) still said cuda:0 after `.to("cpu")`, and conv-BN fusion died on "two devices"
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).cuda()
    with torch.inference_mode():
        cpu_copy = copy.deepcopy(model)
        cpu_copy.to(torch.device("cpu"))
        devices = {t.device.type for t in list(cpu_copy.parameters()) + list(cpu_copy.buffers())}
        assert devices == {"cpu"}
        w = torch.nn.utils.fusion.fuse_conv_bn_weights(
            cpu_copy[0].weight, cpu_copy[0].bias, cpu_copy[1].running_mean, cpu_copy[1].running_var,
            cpu_copy[1].eps, cpu_copy[1].weight, cpu_copy[1].bias)[0]
    assert w.shape == (4, 3, 3, 3) and w.device.type == "cpu"
    assert {p.device.type for p in model.parameters()} == {"cuda"}  # the original stays on the device
    # a dtype change on the device still keeps the Parameter objects (Note [Set data])
    weight = model[0].weight
    model.half()
    assert model[0].weight is weight and weight.dtype == torch.float16


def test_qat_prepare_train_step_and_cpu_convert(emu_a100: gt.Emulation) -> None:
    # the script's epoch in miniature: eager QAT (fuse, prepare_qat), a training step on the device, then in
    # inference mode a deep copy moved to the CPU and converted to a quantized model that runs on the CPU
    torch.backends.quantized.engine = "qnnpack"

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.bn = torch.nn.BatchNorm2d(8)
            self.relu = torch.nn.ReLU()
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dequant(self.relu(self.bn(self.conv(self.quant(x)))))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Net().cuda()
        model.train()
        torch.ao.quantization.fuse_modules_qat(model, [["conv", "bn", "relu"]], inplace=True)
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("qnnpack")
        torch.ao.quantization.prepare_qat(model, inplace=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
        opt.step()
        with torch.inference_mode():
            q = copy.deepcopy(model)
            q.eval()
            q.to(torch.device("cpu"))
            torch.ao.quantization.convert(q, inplace=True)
            out = q(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 8, 14, 14) and out.device.type == "cpu"
