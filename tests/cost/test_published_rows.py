"""The published whole-model rows of bench/published_validation.py: dtype mapping and the stored expected error."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from gpemu.cost.expected_error import load_table
from gpemu.hardware import get_gpu

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def pv():  # type: ignore[no-untyped-def]
    """Return the bench script as a module (bench/ is not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        import published_validation

        yield published_validation
    finally:
        sys.path.remove(str(BENCH))


def test_lambda_fp32_column_is_tf32_from_ampere_on(pv) -> None:  # type: ignore[no-untyped-def]
    # Note [Lambda resnet50 rows]: 12 GPUs x (fp32 column, fp16 column) = 24 rows; the fp32 column is plain fp32 on
    # the Quadro RTX 8000 (Turing) and the V100 (Volta) only, TF32 on the 10 Ampere/Ada/Hopper rows.
    rows = pv.LAMBDA_REFERENCES
    assert len(rows) == 24
    by_dtype = {d: [r for r in rows if r.dtype == d] for d in ("fp32", "tf32", "amp")}
    assert {r.gpu for r in by_dtype["fp32"]} == {"quadro-rtx-6000", "v100-sxm2-32gb"}
    assert len(by_dtype["tf32"]) == 10 and len(by_dtype["amp"]) == 12
    assert all(get_gpu(r.gpu).arch in ("ampere", "ada", "hopper") for r in by_dtype["tf32"])
    assert all(r.layout == "NCHW" and r.mode == "train" and "@ " in r.source for r in rows)


def test_stored_published_error_counts_every_tensor_core_row(pv) -> None:  # type: ignore[no-untyped-def]
    # --write stores the errors of every non-fp32 whole-model row of both CNN tables (10 DLE/torchvision + 22 Lambda
    # = 32) and, for language models, the 8 layer rows + the 44 TF32/fp16 SQuAD rows (48 less the 4 Volta/Turing
    # fp32 ones) = 52; a row added without rerunning `bench/published_validation.py --write` leaves a stale count.
    models = sum(r.dtype != "fp32" for r in (*pv.REFERENCES, *pv.LAMBDA_REFERENCES))
    lms = len(pv.LAYER_REFS) + sum(r.dtype != "fp32" for r in pv.LAMBDA_SQUAD)
    assert (models, lms) == (32, 52)
    paths = load_table()["paths"]
    assert paths["published-models"]["step"]["rows"] == models
    assert paths["published-layers"]["step"]["rows"] == lms


def test_lambda_squad_rows_follow_the_resnet50_rows(pv) -> None:  # type: ignore[no-untyped-def]
    # 12 GPUs x (base, large) x (fp32 column, fp16 column); the fp32 column is TF32 where the resnet50 one is.
    rows = pv.LAMBDA_SQUAD
    assert len(rows) == 48
    tf32_gpus = {r.gpu for r in pv.LAMBDA_REFERENCES if r.dtype == "tf32"}
    assert {r.gpu for r in rows if r.dtype == "tf32"} == tf32_gpus
    assert {r.gpu for r in rows if r.dtype == "fp32"} == {"quadro-rtx-6000", "v100-sxm2-32gb"}


def test_squad_model_has_the_published_shapes(pv) -> None:  # type: ignore[no-untyped-def]
    import torch

    from gpemu.cost.model import op_arrays
    from gpemu.workloads.optrace import trace_training_step

    squad = importlib.import_module("_bert_squad")  # bench/, on sys.path through the pv fixture
    with torch.device("meta"):
        model = squad.BertForQuestionAnswering("bert-base")
    ops = op_arrays(trace_training_step(model, 1, "fp32", "adam", inputs_fn=squad._inputs))
    fwd_mm = sum(f for f, c, ph in zip(ops.flops, ops.category, ops.phase, strict=True)
                 if c == "matmul" and ph == 0)
    # One 384-token sequence through bert-base (h 768, ffn 3072, 12 layers), 2 FLOPs per multiply-add: per layer and
    # token q/k/v/o 4 * 2h^2 + ffn 2 * 2 * h * ffn + scores and context 2 * 2 * S * h = 4,718,592 + 9,437,184 +
    # 1,179,648 = 15,335,424; x 12 layers x 384 tokens = 70,665,633,792; + the span head 2 * 384 * 768 * 2 = 1,179,648.
    assert fwd_mm == 70_665_633_792 + 1_179_648
