"""Inference forwards (model.eval() under no_grad): Note [Inference forward] in gpemu/workloads/optrace.py."""

from __future__ import annotations

import pandas as pd
import pytest

from gpemu.cost.predict import model_phase_seconds, predict_phase
from gpemu.errors import UnknownNameError
from gpemu.hardware import get_gpu
from gpemu.profiles.step import predict_step
from gpemu.workloads.optrace import trace_inference, trace_training_step


def test_inference_trace_is_an_eval_forward_without_autograd() -> None:
    infer = trace_inference("resnet18", 4, "fp32", cache=False)
    train = [r for r in trace_training_step("resnet18", 4, "fp32", "sgd", cache=False) if r.phase == "forward"]
    assert {r.phase for r in infer} == {"forward"}
    # training mode counts batches (num_batches_tracked += 1: one add_ per BN layer, 20 in resnet18) and detaches the
    # ReLU outputs autograd saves (17); eval under no_grad does neither. Residual adds (8) are in both.
    assert sum(r.name == "add_" for r in train) == 28 and sum(r.name == "add_" for r in infer) == 8
    assert not any(r.name == "detach" for r in infer)
    bn_infer = next(r for r in infer if r.name == "native_batch_norm")
    bn_train = next(r for r in train if r.name == "native_batch_norm")
    act_bytes = 4 * 64 * 112 * 112 * 4  # the stem's fp32 output at batch 4: 12,845,056 bytes
    # eval mode normalises with running statistics: read x, write y (2 passes); training also reduces x for the
    # batch mean and variance (3 passes)
    assert bn_infer.bytes == 2 * act_bytes
    assert bn_train.bytes == 3 * act_bytes


def test_inference_is_cheaper_than_a_training_forward() -> None:
    spec = get_gpu("v100-pcie-32gb")
    fwd = model_phase_seconds(spec, "resnet50", "forward", [128])[0]
    inf = model_phase_seconds(spec, "resnet50", "inference", [128])[0]
    # what eval mode drops: a third of every batch-norm's traffic and the bookkeeping ops; the convolutions stay
    assert 0.75 * fwd < inf < fwd


def test_inference_scales_from_a_measured_training_forward() -> None:
    # a measured training forward on X (here the GPU itself) is a source, scaled by model(Y, inference) /
    # model(X, forward): never returned as the inference time
    rows = pd.DataFrame([{"gpu": "v100-pcie-32gb", "workload": "resnet50", "phase": "forward", "batch_size": 128,
                          "dtype": "fp32", "value": 0.12, "unit": "s", "measured": 1, "source": "test"}])
    est = predict_phase("v100-pcie-32gb", "resnet50", "inference", 128, db=rows)
    assert est.path == "scaled-from:v100-pcie-32gb"
    d = est.details
    assert d["source_phase"] == "forward"
    assert est.value == pytest.approx(0.12 * d["model_y_s"] / d["model_x_s"])  # type: ignore[operator]
    assert est.value < 0.12


def test_predict_step_infer_mode() -> None:
    out = predict_step("a100", "resnet18", 64, "amp", mode="infer")
    assert list(out["phases"]) == ["inference", "h2d"] and out["mode"] == "infer"
    assert out["phases"]["inference"]["seconds"] > 0
    assert out["memory"]["source"] == "predicted" and "inference" in out["memory"]["provenance"]
    with pytest.raises(UnknownNameError, match="one of infer, train"):
        predict_step("a100", "resnet18", 64, mode="eval")


def test_inference_figures_have_their_own_expected_error() -> None:
    from gpemu.cost.expected_error import expected_error

    # Note [Expected error]: a 16-bit inference forward of an image model is judged by timm's published inference
    # rows, a training phase by the whole-model training rows
    infer = expected_error("spec-model", "predicted", "inference", "amp", "vision")
    train = expected_error("spec-model", "predicted", "forward", "amp", "vision")
    assert infer is not None and train is not None
    assert "inference" in infer.basis and infer.rows >= 100
    assert infer.basis != train.basis


def test_inference_shows_the_inference_rows_bias_of_its_gpu() -> None:
    # Note [Published bias per GPU]: an RTX 4090 inference forward is compared with timm's inference rows of that
    # board; a GPU without such rows (an A100) falls back to the training rows of its kind
    infer = predict_step("rtx4090", "resnet18", 64, "amp", mode="infer")["published_bias"]
    train = predict_step("rtx4090", "resnet18", 64, "amp")["published_bias"]
    assert infer["model_kind"] == "vision-inference" and infer["rows"] >= 38 and "inference" in infer["basis"]
    assert train["model_kind"] == "vision"
    assert predict_step("a100", "resnet18", 64, "amp", mode="infer")["published_bias"]["model_kind"] == "vision"


def test_bf16_without_bf16_tensor_cores_claims_no_validation() -> None:
    # a V100 has no bf16 math: its bf16 steps run CUDA-core paths (Note [bf16 convolutions before Ampere]) that no
    # published row validates, so no expected error is shown; an A100's bf16 step shows the tensor-core rows' figure
    v100 = predict_step("v100-sxm2-32gb", "resnet18", 32, "amp_bf16")["phases"]["forward"]
    a100 = predict_step("a100", "resnet18", 32, "amp_bf16")["phases"]["forward"]
    assert v100.get("expected_error") is None
    assert a100["expected_error"]["rows"] > 0
