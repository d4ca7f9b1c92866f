"""Tests for memory prediction: hand-derived small models, the GPEmu reference data, max batch size and OOM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gpemu.device.allocator import MIB, EmulatedOutOfMemoryError
from gpemu.errors import UnknownNameError
from gpemu.memory import (
    GPEMU_DATA_SEMANTICS,
    max_batch_size,
    new_allocator,
    predict_memory,
    simulate_training,
)
from gpemu.memory.workspaces import cublas_workspace_bytes, parse_workspace_config


def _mlp(batch_size: int, hidden: int = 512) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    x = torch.empty(batch_size, 256, device="meta")
    y = torch.empty(batch_size, dtype=torch.long, device="meta")
    return model, (x, y)


def test_persistent_memory_of_a_small_mlp_by_hand() -> None:
    model, batch = _mlp(64)
    mem = simulate_training(model, batch, new_allocator("v100", 1 << 40))
    # params rounded to 512 B: W1 512*256*4 = 524288, b1 512*4 = 2048, W2 10*512*4 = 20480, b2 40 -> 512
    params = 524288 + 2048 + 20480 + 512  # = 547328
    assert mem.parameter_bytes == params
    # after a step: params + grads + momentum, input 64*256*4 = 65536, labels 64*8 = 512,
    # the last `output` 64*10*4 = 2560 and `loss` (4 B -> 512)
    assert mem.persistent_bytes == 3 * params + 65536 + 512 + 2560 + 512  # = 1711104
    assert mem.peak_bytes > mem.persistent_bytes


def test_cublas_workspace_policy() -> None:
    assert cublas_workspace_bytes("v100", config="") == 4096 * 1024 * 2 + 16 * 1024 * 8  # 8519680
    assert cublas_workspace_bytes("h100-sxm5-80gb", config="") == 32 * MIB
    assert parse_workspace_config(":4096:8") == 32 * MIB  # 4096 KiB * 8
    assert parse_workspace_config(":0:0") == 0 and parse_workspace_config("garbage") is None
    assert cublas_workspace_bytes("h100-sxm5-80gb", config=":0:0") == 0  # none, not the default
    off = predict_memory("v100", "resnet18", 2, iterations=2, cublas_workspace=False)
    on = predict_memory("v100", "resnet18", 2, iterations=2, cublas_workspace=True)
    tags = on["top_allocations_mib"]
    assert isinstance(tags, dict)
    # two handles (main thread + autograd thread) of 8519680 B each, kept after the step
    assert tags["cublas (main thread) workspace"] == tags["cublas (autograd thread) workspace"] == 8519680 / MIB
    # at least the two workspaces more (an unsplit <= 1 MiB block remainder can add a little more, as on hardware)
    assert float(on["persistent_mib"]) - float(off["persistent_mib"]) >= 2 * 8519680 / MIB


def _measured(shared: Path, gpu: str, model: str, batch: int) -> tuple[float, float]:
    for line in (shared / "gpemu-profiles" / "memory" / gpu / model / "memory.csv").read_text().splitlines()[1:]:
        b, peak, persistent = line.split(",")
        if int(float(b)) == batch:
            return float(peak), float(persistent)
    raise AssertionError(f"batch {batch} not in the data")


@pytest.mark.shared_data
def test_resnet18_matches_gpemu_measurement(shared_data: Path) -> None:
    peak, persistent = _measured(shared_data, "Tesla_V100-PCIE-32GB", "resnet18", 32)
    got = predict_memory("v100", "resnet18", 32, source="torchvision", **GPEMU_DATA_SEMANTICS)
    assert abs(float(got["peak_mib"]) / peak - 1) < 0.03  # validation target: median error <= 3 %
    assert abs(float(got["persistent_mib"]) / persistent - 1) < 0.03


def test_max_batch_size_is_the_largest_that_fits() -> None:
    limit = 600 * MIB  # a v100 with a 600 MiB MIG-like limit (300 MiB go to the CUDA context)
    best = max_batch_size("v100", "resnet18", memory_limit_bytes=limit)
    assert best > 0
    from gpemu.memory.predict import fits

    assert fits("v100", "resnet18", best, memory_limit_bytes=limit)
    assert not fits("v100", "resnet18", best + 1, memory_limit_bytes=limit)


def test_script_halving_its_batch_on_oom_converges_to_max_batch_size() -> None:
    limit = 600 * MIB
    predicted = max_batch_size("v100", "resnet18", memory_limit_bytes=limit)
    # One emulated process: the script catches OOM, halves its batch and tries again on the same allocator.
    allocator = new_allocator("v100", limit)
    from gpemu.memory import build_workload

    batch_size = 1024
    while True:
        model, batch = build_workload("resnet18", batch_size)
        try:
            simulate_training(model, batch, allocator, iterations=2)
            break
        except EmulatedOutOfMemoryError:
            del model, batch
            batch_size //= 2
    assert batch_size <= predicted < 2 * batch_size  # halving lands on the largest power of two that fits
    assert allocator.memory_stats()["num_ooms"] >= 1


def test_autocast_memory_sits_between_fp16_and_fp32() -> None:
    from gpemu.memory.predict import predict_memory

    fp16, amp, fp32 = (predict_memory("a100", "resnet18", 16, d) for d in ("fp16", "amp", "fp32"))
    # autocast keeps fp32 weights, gradients and momentum (3 x 44.6 MiB for resnet18's 11.7 M parameters) but 16-bit
    # activations: its peak lies strictly between a pure-fp16 and a pure-fp32 model's
    assert fp16["peak_mib"] < amp["peak_mib"] < fp32["peak_mib"]
    assert amp["parameter_mib"] == pytest.approx(fp32["parameter_mib"], rel=0.01)
    assert amp["top_allocations_mib"]["optimizer"] == pytest.approx(amp["parameter_mib"], rel=0.05)
    # after the step the same fp32 state persists, with the two 8.125 MiB cuBLAS workspaces in both (Note [cuBLAS
    # workspaces in the autocast simulation]; before session 12 the AMP figure lacked them)
    assert amp["persistent_mib"] == pytest.approx(fp32["persistent_mib"], abs=5.0)
    assert "autocast" in str(amp["source"]) and "heldout_memory_validation" in str(amp["source"])


def test_inference_memory_holds_only_live_activations() -> None:
    # Note [Inference memory]: resnet18 at batch 8, fp32, eval under no_grad. The peak is the persistent memory plus
    # the stem's convolution output and its batch-norm output, both 8 x 64 x 112 x 112 x 4 B = 25,690,112 B
    # (24.5 MiB) alive at once (ReLU then runs in place; max pooling's output and int64 indices take 18.4 MiB less).
    # A training step keeps every layer's activations for the backward: several times that.
    infer = predict_memory("a100", "resnet18", 8, mode="infer")
    train = predict_memory("a100", "resnet18", 8)
    # images 8 x 3 x 224 x 224 x 4 = 4,816,896 B, labels 8 x 8 B = 64 B, one 512 B block
    assert infer["batch_mib"] == pytest.approx((4_816_896 + 512) / 2**20)
    # plus batch norm's two per-channel outputs (save_mean, save_invstd: 64 x 4 B, one 512 B block each)
    assert infer["peak_mib"] - infer["persistent_mib"] == pytest.approx((2 * 25_690_112 + 2 * 512) / 2**20)
    assert train["peak_mib"] > 3 * infer["peak_mib"]
    assert "inference" in str(infer["source"])
    with pytest.raises(UnknownNameError, match="infer, train"):
        predict_memory("a100", "resnet18", 8, mode="eval")


def test_a_constructor_that_reads_tensors_is_built_on_the_host() -> None:
    # Note [Constructors that read tensors]: torchvision's RegNets compute their block widths with torch ops and
    # .tolist(), which meta tensors refuse. regnet_y_400mf: 4,344,144 parameters x 4 B x 3 (weights, gradients,
    # momentum) = 49.7 MiB of persistent state plus a batch of 2 images (1.15 MiB) and the cuBLAS workspaces.
    from gpemu.memory.predict import predict_memory

    mem = predict_memory("a100", "regnet_y_400mf", 2)
    assert 50.0 < float(mem["persistent_mib"]) < 70.0  # type: ignore[arg-type]
    assert float(mem["peak_mib"]) > float(mem["persistent_mib"])  # type: ignore[arg-type]
