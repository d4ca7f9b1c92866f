"""The published whole-model rows of bench/published_validation.py: dtype mapping and the stored expected error."""

from __future__ import annotations

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
    # --write stores the errors of every non-fp32 whole-model row of both tables (10 DLE/torchvision + 22 Lambda = 32);
    # a row added without rerunning `bench/published_validation.py --write` leaves a stale count here.
    expected = sum(r.dtype != "fp32" for r in (*pv.REFERENCES, *pv.LAMBDA_REFERENCES))
    assert expected == 32
    assert load_table()["paths"]["published-models"]["step"]["rows"] == expected
