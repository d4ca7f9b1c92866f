"""Tests for gpemu.workloads.optrace: meta tracing of a training step, phases, autocast emulation, disk cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gpemu.cost.predict import batch_linear_ops
from gpemu.errors import UnknownNameError
from gpemu.workloads.optrace import trace_training_step


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1000))


def _inputs(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(batch_size, 64, device="meta"), torch.zeros(batch_size, dtype=torch.long, device="meta")


def test_phases_and_flops_of_a_small_mlp() -> None:
    records = trace_training_step(_mlp(), batch_size=8, inputs_fn=_inputs)
    fwd = [r for r in records if r.phase == "forward"]
    # forward: addmm 2*8*64*32 = 32768 and addmm 2*8*32*1000 = 512000 -> 544768
    assert sum(r.flops for r in fwd if r.category == "matmul") == 544768
    bwd = [r for r in records if r.phase == "backward" and r.category == "matmul"]
    # backward: layer 2 grad_input 2*8*1000*32 + grad_weight 2*1000*8*32 = 1024000; layer 1 grad_weight only
    # (the input needs no grad) 2*32*8*64 = 32768 -> 1056768
    assert sum(r.flops for r in bwd) == 1056768
    assert {r.phase for r in records} == {"forward", "backward", "optimizer"}
    assert all(r.gpemu_phase == "backward" for r in records if r.phase == "optimizer")


def test_amp_runs_matmuls_in_fp16_and_losses_in_fp32() -> None:
    records = trace_training_step(_mlp(), batch_size=8, dtype="amp", inputs_fn=_inputs)
    mm = {r.dtype for r in records if r.phase == "forward" and r.category == "matmul"}
    assert mm == {"fp16"}
    assert any(r.name == "_to_copy" for r in records)  # autocast's casts are real kernels
    assert {r.dtype for r in records if r.name == "_log_softmax"} == {"fp32"}


def test_transformer_attention_routes_to_fused_kernels() -> None:
    records = trace_training_step("gpt2", batch_size=1, dtype="amp", cache=False)
    names = {r.name for r in records if r.category == "attention"}
    assert names == {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"}


def test_unknown_dtype_and_optimizer_are_user_errors() -> None:
    with pytest.raises(UnknownNameError, match="dtype"):
        trace_training_step(_mlp(), 2, dtype="fp8x")
    with pytest.raises(UnknownNameError, match="optimizer"):
        trace_training_step(_mlp(), 2, optimizer="sgdd")


def test_traces_are_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPEMU_CACHE_DIR", str(tmp_path))
    first = trace_training_step("alexnet", 2)
    files = list((tmp_path / "optrace").glob("alexnet-b2-fp32-sgd-*.json"))
    assert len(files) == 1
    assert trace_training_step("alexnet", 2) == first


def test_batch_linear_extension_matches_a_direct_trace() -> None:
    ops = batch_linear_ops("resnet18", "fp32")
    direct = trace_training_step("resnet18", 8, optimizer="sgd-gpemu")
    flops, nbytes = ops.at_batch(8)
    assert flops.sum() == pytest.approx(sum(r.flops for r in direct), rel=1e-9)
    assert nbytes.sum() == pytest.approx(sum(r.bytes for r in direct), rel=1e-9)


def test_models_that_compute_in_their_constructor_still_build_on_meta() -> None:
    from gpemu.workloads.optrace import build_on_meta

    model = build_on_meta("regnet_x_400mf")  # its width schedule calls .item() under torch.device("meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
