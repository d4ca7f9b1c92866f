"""Tests for gpemu.cost.predict: the profile -> scaled-from -> spec-model ladder and per-op predictions."""

from __future__ import annotations

import pandas as pd
import pytest

from gpemu.cost.predict import model_phase_seconds, phase_op_seconds, predict_ops, predict_phase
from gpemu.errors import UnknownNameError
from gpemu.estimate import Estimate
from gpemu.hardware import get_gpu, list_gpus
from gpemu.workloads.optrace import trace_training_step


def test_unprofiled_gpu_gets_a_spec_model_prediction() -> None:
    fwd = predict_phase(get_gpu("h100-sxm5-80gb"), "resnet18", "forward", 32)
    bwd = predict_phase(get_gpu("h100-sxm5-80gb"), "resnet18", "backward", 32)
    assert (fwd.kind, fwd.path, fwd.unit) == ("predicted", "spec-model", "s")
    assert 0 < fwd.value < bwd.value


def test_every_catalog_gpu_gets_a_labelled_prediction() -> None:
    values = {}
    for spec in list_gpus():
        est = predict_phase(spec, "resnet18", "forward", 64)
        assert est.kind == "predicted" and est.path == "spec-model", spec.key
        values[spec.key] = est.value
    assert values["h100-sxm5-80gb"] < values["v100-pcie-32gb"] < values["k80"]


def test_scaled_from_the_closest_measured_gpu() -> None:
    rows = pd.DataFrame([
        {"gpu": "v100-pcie-32gb", "workload": "resnet18", "phase": "forward", "batch_size": 64, "dtype": "fp32",
         "value": 0.05, "unit": "s", "measured": 1, "source": "test"},
        {"gpu": "k80", "workload": "resnet18", "phase": "forward", "batch_size": 64, "dtype": "fp32",
         "value": 0.3, "unit": "s", "measured": 1, "source": "test"},
    ])
    est = predict_phase("v100-sxm2-32gb", "resnet18", "forward", 64, db=rows)
    assert est.path == "scaled-from:v100-pcie-32gb"  # same arch, closest spec
    d = est.details
    assert est.value == pytest.approx(0.05 * d["model_y_s"] / d["model_x_s"])  # type: ignore[operator]


def test_nearest_source_without_the_batch_size_gives_the_spec_model() -> None:
    # Note [Nearest source or the spec model]: the V100-PCIe (same generation as a V100-SXM2) measured resnet18 at
    # batch 32 only; the K80 (three generations away) at 64. Batch 32 scales from the V100-PCIe; batch 64 does not
    # fall back to the K80 but to the spec model.
    common = {"workload": "resnet18", "phase": "forward", "dtype": "fp32", "unit": "s", "measured": 1, "source": "t"}
    rows = pd.DataFrame([{**common, "gpu": "v100-pcie-32gb", "batch_size": 32, "value": 0.03},
                         {**common, "gpu": "k80", "batch_size": 64, "value": 0.3}])
    assert predict_phase("v100-sxm2-32gb", "resnet18", "forward", 32, db=rows).path == "scaled-from:v100-pcie-32gb"
    assert predict_phase("v100-sxm2-32gb", "resnet18", "forward", 64, db=rows).path == "spec-model"
    # with the V100-PCIe excluded the K80 is the nearest source that measured resnet18, and it has batch 64
    est = predict_phase("v100-sxm2-32gb", "resnet18", "forward", 64, db=rows, exclude_gpus=("v100-pcie-32gb",))
    assert est.path == "scaled-from:k80"


class _StandInDB:
    rows = pd.DataFrame(columns=["gpu", "workload", "phase", "batch_size", "dtype", "value", "unit", "measured"])

    def lookup(self, gpu: str, workload: str, phase: str, batch_size: int, dtype: str = "fp32") -> Estimate:
        if gpu == "v100-pcie-32gb":
            return Estimate(0.123, "s", "interpolated", source="stand-in")
        return Estimate(float("nan"), "s", "missing")


def test_profile_rows_win_over_the_model() -> None:
    assert predict_phase("v100", "resnet50", "forward", 48, db=_StandInDB()).value == 0.123
    assert predict_phase("t4", "resnet50", "forward", 48, db=_StandInDB()).path == "spec-model"


def test_bad_phase_is_a_user_error() -> None:
    with pytest.raises(UnknownNameError):
        predict_phase("v100", "resnet18", "forwards", 8)


def test_predict_ops_prices_kernels_and_not_views() -> None:
    records = trace_training_step("alexnet", 2)
    times = predict_ops("v100", records)
    assert len(times) == len(records)
    assert all(t == 0 for t, r in zip(times, records, strict=True) if r.category == "view")
    assert all(t > 0 for t, r in zip(times, records, strict=True) if r.category != "view")


def test_phase_op_seconds_are_the_kernels_the_phase_time_sums() -> None:
    # alexnet's forward at batch 2 on a V100, per op (views folded away). The phase time is
    # t0 + max_j(host_j + kernels from j on) >= t0 + every kernel (j = 0), so it exceeds the per-op sum.
    per_op, categories = phase_op_seconds("v100", "alexnet", "forward", 2)
    forward = [r for r in trace_training_step("alexnet", 2) if r.phase == "forward" and r.category != "view"]
    assert categories == [r.category for r in forward]
    assert (per_op > 0).all()
    assert model_phase_seconds(get_gpu("v100"), "alexnet", "forward", [2])[0] > per_op.sum()


def test_tf32_speeds_up_matmuls_only_where_tensor_cores_have_it() -> None:
    a100_fp32 = predict_phase("a100", "gpt2", "forward", 4, "fp32").value
    a100_tf32 = predict_phase("a100", "gpt2", "forward", 4, "tf32").value
    v100_fp32 = predict_phase("v100", "gpt2", "forward", 4, "fp32").value
    v100_tf32 = predict_phase("v100", "gpt2", "forward", 4, "tf32").value
    assert a100_tf32 < 0.6 * a100_fp32  # 156 TF32 TFLOPS * tc_eff 0.77 = 120 vs 19.5 * e_matmul 0.9 fp32
    assert v100_tf32 == v100_fp32  # Volta has no TF32


def test_a_vit_at_a_training_batch_prices_its_token_gemms_on_tensor_cores() -> None:
    # Note [Tensor-core flags at training batch sizes]: ViT-B/16's 197 tokens make the batch-2/4 traces' GEMMs
    # misaligned (394 and 788 rows) but batch 64's aligned (12,608 rows). Its forward is ~17.6 GFLOP per image,
    # 1.13 TFLOP at batch 64: ~4.7 ms on an A100's tensor cores (312 TFLOP/s x tc_eff 0.77), 58 ms on CUDA cores
    # (19.5 TFLOP/s), plus ~10-20 ms of memory-bound ops and host dispatch. Under 40 ms rules out CUDA-core GEMMs
    # (the batch-2 flags gave 131.8 ms); over 10 ms, a forward with nothing but GEMMs.
    from gpemu.cost.predict import predict_phase

    forward_s = predict_phase("a100", "vit_b_16", "forward", 64, "amp").value
    assert 0.010 < forward_s < 0.040


def test_a_sibling_dtype_on_the_same_gpu_is_the_source() -> None:
    # Note [A sibling dtype on the same GPU]: an H200 that measured resnet18's fp16 AMP forward (here a made-up
    # 10 ms at batch 64) prices the bf16 AMP forward as that row x model(amp_bf16) / model(amp), not from the spec.
    import pandas as pd

    from gpemu.cost.predict import model_phase_seconds, predict_phase
    from gpemu.hardware import get_gpu
    from gpemu.profiles.db import ProfileDB

    spec = get_gpu("h200")
    rows = pd.DataFrame([{"gpu": spec.key, "workload": "resnet18", "phase": "forward", "batch_size": 64,
                          "dtype": "amp", "value": 0.010, "unit": "s", "measured": 1, "source": "test"}])
    est = predict_phase(spec, "resnet18", "forward", 64, dtype="amp_bf16", db=ProfileDB.from_rows(rows))
    ratio = (model_phase_seconds(spec, "resnet18", "forward", [64], "amp_bf16")[0]
             / model_phase_seconds(spec, "resnet18", "forward", [64], "amp")[0])
    assert est.path == "scaled-from-dtype:amp"
    assert est.value == pytest.approx(0.010 * ratio, rel=1e-9)
    # another GPU does not take the H200's fp16 row as its own sibling
    other = predict_phase(get_gpu("h100"), "resnet18", "forward", 64, dtype="amp_bf16", db=ProfileDB.from_rows(rows))
    assert not other.path.startswith("scaled-from-dtype")


def test_between_the_sources_measured_batches_its_ratio_is_interpolated() -> None:
    # Note [Between the source's measured batch sizes]: a V100 measured resnet18's forward at batch 16 and 64 only,
    # each 1.2x its own model time (made-up rows: 1.2 x model). A V100-SXM2 at batch 32 used to fall to the spec model;
    # now it takes the ratio interpolated in log-log between 16 and 64 (both 1.2, so 1.2 at 32: w = log(32/16) /
    # log(64/16) = 0.5) times its own model time, on the scaled path, and lies between the neighbours' predictions.
    # Outside the measured range (batch 128) the spec model stays (Note [Nearest source or the spec model]).
    from gpemu.cost.model import load_params
    from gpemu.cost.predict import borrow_factors

    x = get_gpu("v100-pcie-32gb")
    rows = pd.DataFrame([
        {"gpu": x.key, "workload": "resnet18", "phase": "forward", "batch_size": b, "dtype": "fp32",
         "value": 1.2 * float(model_phase_seconds(x, "resnet18", "forward", [b])[0]), "unit": "s", "measured": 1,
         "source": "test"} for b in (16, 64)])
    y = get_gpu("v100-sxm2-32gb")
    at = {b: predict_phase(y, "resnet18", "forward", b, db=rows) for b in (16, 32, 64, 128)}
    assert at[32].path == "scaled-from:v100-pcie-32gb" and at[32].details["interpolated_between"] == [16, 64]
    params = load_params()
    if y.key not in params.per_gpu:  # Note [Borrowed factors]
        params = borrow_factors(params, y.key, x.key)
    own = float(model_phase_seconds(y, "resnet18", "forward", [32], params=params)[0])
    assert at[32].value == pytest.approx(1.2 * own, rel=1e-9)
    assert at[16].value < at[32].value < at[64].value
    assert at[128].path == "spec-model"


def test_an_interpolated_ratio_is_log_linear_in_the_batch() -> None:
    # ratios 1.0 at batch 1 and 4.0 at batch 16: at batch 4, w = log(4) / log(16) = 0.5, r = exp(0.5 log 4) = 2.0
    from gpemu.cost.predict import _interpolated_ratio

    series = {1: 1.0, 16: 4.0, 64: 8.0}
    r, lo, hi = _interpolated_ratio(series, 4, lambda b: 1.0)  # type: ignore[misc]
    assert (lo, hi) == (1, 16) and r == pytest.approx(2.0, rel=1e-12)
    assert _interpolated_ratio(series, 128, lambda b: 1.0) is None  # beyond the measured range
    assert _interpolated_ratio(series, 16, lambda b: 2.0) == (2.0, 16, 16)  # a measured batch: its own ratio


def test_a_sibling_dtype_on_another_gpu_is_a_source() -> None:
    # Note [A sibling dtype on another GPU]: only an A100-SXM4 measured resnet18's forward, in fp32 (a made-up 20 ms
    # at batch 64); an A100-PCIe asked for TF32 GEMMs is that row x model(PCIe, tf32) / model(SXM4, fp32), on the
    # scaled path, not the spec model.
    from gpemu.cost.model import load_params
    from gpemu.cost.predict import borrow_factors

    x, y = get_gpu("a100-sxm4-80gb"), get_gpu("a100-pcie-40gb")
    rows = pd.DataFrame([{"gpu": x.key, "workload": "resnet18", "phase": "forward", "batch_size": 64, "dtype": "fp32",
                          "value": 0.020, "unit": "s", "measured": 1, "source": "test"}])
    est = predict_phase(y, "resnet18", "forward", 64, dtype="tf32", db=rows)
    params = load_params()
    if y.key not in params.per_gpu:  # Note [Borrowed factors]
        params = borrow_factors(params, y.key, x.key)
    ratio = (model_phase_seconds(y, "resnet18", "forward", [64], "tf32", params)[0]
             / model_phase_seconds(x, "resnet18", "forward", [64], "fp32")[0])
    assert est.path == f"scaled-from:{x.key}" and est.details["from_dtype"] == "fp32"
    assert est.value == pytest.approx(0.020 * ratio, rel=1e-9)
    # a dtype with no measured sibling anywhere keeps the spec model
    assert predict_phase(y, "resnet18", "forward", 64, dtype="fp16", db=rows).path == "spec-model"


def test_own_rows_between_measured_batches_come_before_another_gpu() -> None:
    # Note [Own rows between measured batches]: an H100 measured resnet50's NCHW forward at batch 64 and 256 (made-up
    # rows: 1.3 x its model time), an H200 at 128 (2.0 x). Channels_last at batch 128 is the H100's own ratio
    # interpolated (1.3 at both ends, so 1.3) x model(H100, channels_last), not the H200's row; at batch 512, beyond
    # the H100's range, the H200 row does not bracket it either and the spec model answers
    from gpemu.cost.model import load_params

    y, x = get_gpu("h100-sxm5-80gb"), get_gpu("h200-sxm-141gb")
    params = load_params()

    def row(spec: object, b: int, factor: float) -> dict[str, object]:
        value = factor * float(model_phase_seconds(spec, "resnet50", "forward", [b], "amp", params)[0])  # type: ignore[arg-type]
        return {"gpu": spec.key, "workload": "resnet50", "phase": "forward", "batch_size": b,  # type: ignore[attr-defined]
                "dtype": "amp", "value": value, "unit": "s", "measured": 1, "source": "test"}

    rows = pd.DataFrame([row(y, 64, 1.3), row(y, 256, 1.3), row(x, 128, 2.0)])
    est = predict_phase(y, "resnet50", "forward", 128, "amp", db=rows, memory_format="channels_last")
    nhwc = float(model_phase_seconds(y, "resnet50", "forward", [128], "amp", params, memory_format="channels_last")[0])
    assert est.path == f"scaled-from:{y.key}" and est.details["interpolated_between"] == [64, 256]
    assert est.value == pytest.approx(1.3 * nhwc, rel=1e-9)
    # the 512 end: beyond the H100's range and no other GPU measured it there: the spec model
    assert predict_phase(y, "resnet50", "forward", 512, "amp", db=rows, memory_format="channels_last").path == (
        "spec-model")
    # inference at 128 takes the same own ratio over the inference model
    inf = predict_phase(y, "resnet50", "inference", 128, "amp", db=rows)
    inf_model = float(model_phase_seconds(y, "resnet50", "inference", [128], "amp", params)[0])
    assert inf.path == f"scaled-from:{y.key}" and inf.value == pytest.approx(1.3 * inf_model, rel=1e-9)
