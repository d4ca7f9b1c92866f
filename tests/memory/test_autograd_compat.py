"""Tests for legacy_hardtanh: in-place ReLU6 saves its result (torch <= 1.9), not a copy of its input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from gpemu.memory import GPEMU_DATA_SEMANTICS, MemoryTracker, legacy_hardtanh, new_allocator, predict_memory


def _conv_relu6_live_bytes() -> tuple[int, tuple[int, ...]]:
    """Return (bytes live after conv -> relu6_ forward, shape of the weight gradient after backward)."""
    allocator = new_allocator("v100", 1 << 40)
    w = torch.empty(8, 3, 3, 3, device="meta", requires_grad=True)
    x = torch.empty(4, 3, 16, 16, device="meta")
    with MemoryTracker(allocator) as tracker:
        y = F.relu6(F.conv2d(x, w, padding=1), inplace=True)
        live = tracker.live_bytes()
        y.sum().backward()
    assert w.grad is not None
    return live, tuple(w.grad.shape)


def test_inplace_relu6_saves_its_result_under_legacy_rule() -> None:
    # conv output 4 * 8 * 16 * 16 * 4 B = 32768 B (a multiple of 512: no rounding). torch <= 1.9 saves the
    # relu6_ result, which is the conv output's storage: 32768 B live.
    with legacy_hardtanh():
        live, grad_shape = _conv_relu6_live_bytes()
    assert live == 32768
    assert grad_shape == (8, 3, 3, 3)  # backward still runs through the saved result


def test_installed_torch_clones_the_input_of_inplace_relu6() -> None:
    # torch >= 1.10 (pytorch#95432): autograd saves a clone of the input: 2 * 32768 = 65536 B live. Checked
    # after a legacy_hardtanh() block to make sure leaving it restores torch's own kernel.
    with legacy_hardtanh():
        pass
    live, _ = _conv_relu6_live_bytes()
    assert live == 65536


def test_nested_legacy_blocks_keep_the_rule_until_the_outer_one_ends() -> None:
    with legacy_hardtanh():
        with legacy_hardtanh():
            pass
        live, _ = _conv_relu6_live_bytes()
    assert live == 32768  # still one conv output (4 * 8 * 16 * 16 * 4 B), not two


def _measured_peak_mib(shared_data: Path, model: str, batch: int) -> float:
    rows = (shared_data / "gpemu-profiles" / "ROWS.csv").read_text().splitlines()
    for line in rows:
        kind, gpu, name, b, value, _unit, measured = line.split(",")
        if (kind, gpu, name, b, measured) == ("mem_peak", "Tesla_V100-PCIE-32GB", model, str(batch), "1"):
            return float(value)
    raise AssertionError(f"{model} batch {batch} not in the data")


@pytest.mark.shared_data
def test_mobilenet_v2_peak_matches_gpemu_measurement(shared_data: Path) -> None:
    # mobilenet_v2 has 35 ReLU6(inplace=True) after BatchNorm; per sample their inputs total 19.57 MiB
    # (sum of C*H*W*4 B over the 35 BN outputs), so the clone rule adds ~35 % of the activations. Measured on a
    # V100: 1722.3 MiB at batch 32 (~52.0 MiB per sample from 32 to 64); result-saving rule within 1 %, clone
    # rule 2472.6 MiB (+44 %).
    measured = _measured_peak_mib(shared_data, "mobilenet_v2", 32)
    legacy = float(predict_memory(
        "v100", "mobilenet_v2", 32, source="torchvision", **GPEMU_DATA_SEMANTICS
    )["peak_mib"])
    clone = float(
        predict_memory("v100", "mobilenet_v2", 32, source="torchvision", **{**GPEMU_DATA_SEMANTICS, "hardtanh_inplace_clone": True})["peak_mib"]
    )
    assert abs(legacy / measured - 1) < 0.01
    # the clone rule holds one more copy of every ReLU6 input: at least 32 * 19 MiB more at batch 32
    assert clone - legacy > 32 * 19.0


def _aten_ops(fn: Any) -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    names: list[str] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Spy():
        fn()
    return names


def test_cuda_dropout_runs_the_fused_kernel_on_meta() -> None:
    from gpemu.memory.autograd_compat import cuda_dropout

    x = torch.empty(256, 1024, device="meta")
    plain = _aten_ops(lambda: torch.nn.functional.dropout(x, 0.5))
    assert "bernoulli_.float" in plain  # the composite path: a noise tensor in fp32 (4 bytes per element)
    with cuda_dropout():
        fused = _aten_ops(lambda: torch.nn.functional.dropout(x, 0.5))
    assert fused == ["native_dropout.default"]  # CUDA's kernel: output + a 1-byte mask


def test_cuda_sdpa_routes_meta_tensors_like_the_gpu() -> None:
    from gpemu.memory.autograd_compat import cuda_sdpa

    q = torch.empty(2, 4, 128, 64, device="meta", dtype=torch.float16)
    with cuda_sdpa((8, 0)):
        a100 = _aten_ops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    with cuda_sdpa((7, 0)):
        v100 = _aten_ops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert a100 == ["_scaled_dot_product_flash_attention.default"]  # sm80, fp16, no mask
    assert v100 == ["_scaled_dot_product_efficient_attention.default"]  # no flash before sm80
