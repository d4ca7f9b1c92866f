"""TF32 flags change how fp32 GEMMs and convolutions are priced on GPUs with TF32 tensor cores (Note [FP32 math
modes] in cost/roofline.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.cost import load_params
from gpemu.hardware import get_gpu


@pytest.fixture
def flags() -> Iterator[None]:
    """The fp32 precision settings are restored after each test by conftest's autouse fixture."""
    yield


def _busy_s(gpu: str, fn) -> float:  # type: ignore[no-untyped-def]
    emu = gt.install(gpu)
    try:
        dev = emu.devices[0]
        x = torch.randn(4096, 4096, device="cuda")
        img = torch.randn(64, 256, 28, 28, device="cuda")
        conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda()
        torch.cuda.synchronize()
        before = dev.busy_s()
        fn(x, img, conv)
        torch.cuda.synchronize()
        return dev.busy_s() - before
    finally:
        gt.uninstall()


def test_matmul_precision_high_prices_fp32_gemms_on_tf32(flags: None) -> None:
    ieee = _busy_s("a100", lambda x, img, conv: x @ x)
    torch.set_float32_matmul_precision("high")
    tf32 = _busy_s("a100", lambda x, img, conv: x @ x)
    # 2 * 4096^3 = 137.4 GFLOP: at the fp32 CUDA-core peak (19.5 TFLOPS x the fitted e_matmul 0.9 x the borrowed a)
    # ~7-8 ms, on TF32 tensor cores (156 TFLOPS x tc_eff 0.77) ~1.1 ms
    p = load_params()
    spec = get_gpu("a100")
    assert tf32 == pytest.approx(137.4e9 / (spec.peak_tflops["tf32"] * 1e12 * p.tc_eff), rel=0.05)
    assert ieee / tf32 > 5
    # a GPU without TF32 (V100) prices both the same
    torch.set_float32_matmul_precision("highest")
    v_ieee = _busy_s("v100", lambda x, img, conv: x @ x)
    torch.set_float32_matmul_precision("high")
    assert _busy_s("v100", lambda x, img, conv: x @ x) == pytest.approx(v_ieee, rel=1e-9)


def test_cudnn_tf32_off_prices_fp32_convolutions_on_cuda_cores(flags: None) -> None:
    tf32 = _busy_s("a100", lambda x, img, conv: conv(img))
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    ieee = _busy_s("a100", lambda x, img, conv: conv(img))
    # 2 * 64*28*28 * 256*256*9 = 59.2 GFLOP: TF32 convolutions (the default) run ~8x the CUDA-core peak.
    # TF32: 59.2e9 / (156e12 * tc_eff 0.77) = 0.49 ms. IEEE, a staged CUDA-core 3x3 convolution (Note [Staged
    # convolutions]): 59.2e9 / (19.5e12 * e_conv 3.0 * a 1.07) = 0.95 ms (Winograd: fewer multiplies than direct
    # convolution) plus its transform traffic, x and y 2 * 51.4 MB / (2039e9 * m_conv 0.125 * b 1.14) = 0.35 ms:
    # ~1.3 ms, 2.7x the TF32 time
    assert ieee / tf32 > 2


def _resnet_step_s(gpu: str) -> tuple[float, object]:
    import torchvision

    emu = gt.install(gpu)
    try:
        model = torchvision.models.resnet18().cuda()
        x = torch.randn(8, 3, 224, 224, device="cuda")
        dev = emu.devices[0]
        busy = []
        for _ in range(3):
            torch.cuda.synchronize()
            before = dev.busy_s()
            model(x).sum().backward()
            torch.cuda.synchronize()
            busy.append(dev.busy_s() - before)
        return busy[-1], emu.phases.key
    finally:
        gt.uninstall()


def test_an_identified_model_follows_the_flags(flags: None) -> None:
    default_s, key = _resnet_step_s("a100")
    assert key is not None and key[2] == "fp32"  # TF32 convolutions, IEEE GEMMs: torch's defaults
    torch.set_float32_matmul_precision("high")
    tf32_s, key = _resnet_step_s("a100")
    assert key is not None and key[2] == "tf32"  # priced by the tf32 phase prediction
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    ieee_s, key = _resnet_step_s("a100")
    assert key is None  # no phase prediction prices IEEE convolutions: per-op
    # resnet18's one GEMM (the classifier) barely moves the phase-predicted step
    assert tf32_s == pytest.approx(default_s, rel=0.05)
    assert ieee_s > 0


def test_flags_changed_between_bare_ops_are_seen_at_the_sync(flags: None) -> None:
    # Note [TF32 flags between ops]: the same 4096^3 fp32 GEMM timed under TF32 and then IEEE, no module call between
    # (a micro-benchmark). Before the fix the IEEE loop reused the TF32 price (0.37 ms on an H200 where the card took
    # 2.82 ms). A100: TF32 137.4 GFLOP / (156 TFLOPS x tc_eff ~0.75) ~1.2 ms; IEEE on CUDA cores 5x slower or more.
    emu = gt.install("a100")
    try:
        dev = emu.devices[0]
        x = torch.randn(4096, 4096, device="cuda")

        def busy() -> float:
            torch.cuda.synchronize()
            before = dev.busy_s()
            x @ x
            torch.cuda.synchronize()
            return dev.busy_s() - before

        torch.backends.cuda.matmul.fp32_precision = "tf32"
        tf32 = busy()
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        ieee = busy()
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert ieee / tf32 > 5
        assert busy() == pytest.approx(tf32, rel=1e-6)
    finally:
        gt.uninstall()
