"""The published torch.compile rows of bench/_timm_dynamo_rows.py: every model in every file, copied consistently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    """Return (the dynamo rows module, the eager rows module); bench/ is not a package."""
    sys.path.insert(0, str(BENCH))
    try:
        import _timm_dynamo_rows
        import _timm_infer_rows

        yield _timm_dynamo_rows, _timm_infer_rows
    finally:
        sys.path.remove(str(BENCH))


def test_every_model_is_in_every_dynamo_file_at_its_eager_rows_size(rows) -> None:  # type: ignore[no-untyped-def]
    # 4 files x 40 models = 160 rows, one per (file, model), each at the image size of its eager twin's row
    dyn, eager = rows
    assert len(dyn.ROWS) == 160
    assert {(r[0], r[1]) for r in dyn.ROWS} == {(f, m) for f in dyn.SOURCES for m in eager.MODELS}
    eager_size = {(r[0], r[1]): r[2] for r in eager.ROWS}
    assert all(r[2] == eager_size[(dyn.EAGER_TWIN[r[0]], r[1])] for r in dyn.ROWS)
    assert set(dyn.EAGER_TWIN) == set(dyn.SOURCES) and set(dyn.EAGER_TWIN.values()) <= set(eager.SOURCES)


def test_step_time_agrees_with_batch_over_throughput(rows) -> None:  # type: ignore[no-untyped-def]
    # the transcription check: infer_step_time (ms) = 1000 * batch / samples_per_s to <1% on each row, e.g.
    # resnet50 on rtx4090-pt240-dynamo: 1000 * 256 / 8237.46 = 31.078 ms against the 31.069 ms written
    dyn, _ = rows
    bad = [r for r in dyn.ROWS if abs(1000 * r[5] / r[3] / r[4] - 1) >= 0.01]
    assert bad == []
