"""How far to trust a figure: the validation error of the path that produced it (Note [Expected error])."""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Note [Expected error]: every figure gpemu gives names where it came from (Estimate.kind / path); a researcher also
# needs to know how far off such a figure has been when it could be checked. expected_error.json holds, per path,
# the absolute % errors that path made on held-out real measurements:
# - "profile-interpolation" / "profile-extrapolation": each measured row of ../shared/data left out in turn and
#   looked up from the rest of its series by ProfileDB (linear between the neighbouring batch sizes; the
#   least-squares line through the end of the range);
# - "scaled-from": leave-one-GPU-out, the held-out GPU scaled from the nearest GPU that measured the model;
# - "spec-model": the same folds from the spec alone; "spec-model, unseen model": leave-models-out (the model was
#   not in the fit: a user's own module, a torchvision model outside the data);
# - "published-models" / "published-layers": 16-bit and TF32 predictions have no measured rows in ../shared/data,
#   so their figures are the published real-GPU throughputs of bench/published_validation.py (whole CNNs; BERT and
#   GPT-2 layers for language models); "published-inference": an inference forward of an image model in 16-bit or
#   TF32, timm's published inference throughputs on recent RTX boards (bench/timm_infer_validation.py --write).
# Written by `bench/predict_validation.py --write` and `bench/published_validation.py --write`, never by hand; the
# file records the fitted.json it was measured against (`fitted_sha256`) and a test fails when fitted.json has
# changed since, so a refit without a re-validation does not ship old error figures. The figures are of the fp32
# GPEmu rows (30 CNNs with measured rows, 5 GPUs from K80 to V100): a GPU generation or model family far from those
# can do worse.
EXPECTED_ERROR_PATH = Path(__file__).with_name("expected_error.json")
FITTED_PATH = Path(__file__).with_name("fitted.json")
_TENSOR_CORE_DTYPES = frozenset({"tf32", "fp16", "bf16", "amp", "amp_bf16"})


@dataclass(frozen=True)
class ExpectedError:
    """Absolute % error of one prediction path on held-out real measurements."""

    median_pct: float
    p90_pct: float
    rows: int
    basis: str

    def short(self) -> str:
        """Return e.g. '~7% (p90 22%)'."""
        return f"~{self.median_pct:.0f}% (p90 {self.p90_pct:.0f}%)"

    def to_json(self) -> dict[str, object]:
        """Return the `predict --json` object."""
        return {"median_abs_pct": round(self.median_pct, 2), "p90_abs_pct": round(self.p90_pct, 2),
                "rows": self.rows, "basis": self.basis}


def fitted_sha256(path: Path = FITTED_PATH) -> str:
    """Return the SHA-256 of fitted.json's bytes (what an expected_error.json was measured against)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def load_table(path: Path = EXPECTED_ERROR_PATH) -> dict[str, Any]:
    """Return the packaged expected_error.json ({} when absent)."""
    if not path.exists():
        return {}
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def table_key(path: str, kind: str, dtype: str = "fp32", model_kind: str = "vision",
              seen_model: bool = True) -> str | None:
    """Return the expected_error.json entry for an Estimate's (path, kind), or None for a measured figure."""
    if kind == "measured":
        return None
    if kind in ("interpolated", "extrapolated"):
        return "profile-interpolation" if kind == "interpolated" else "profile-extrapolation"
    if dtype in _TENSOR_CORE_DTYPES:
        return "published-layers" if model_kind == "lm" else "published-models"
    if path.startswith("scaled-from"):
        return "scaled-from"
    if path == "spec-model":
        return "spec-model" if seen_model else "spec-model, unseen model"
    return None


def expected_error(path: str, kind: str, phase: str, dtype: str = "fp32", model_kind: str = "vision",
                   seen_model: bool = True) -> ExpectedError | None:
    """Return the validation error of the path that produced a forward/backward figure (None when there is none)."""
    key = table_key(path, kind, dtype, model_kind, seen_model)
    table = load_table()
    if phase == "inference" and key == "published-models" and "published-inference" in table.get("paths", {}):
        key = "published-inference"  # timm's inference rows (bench/timm_infer_validation.py --write)
    entry = table.get("paths", {}).get(key) if key else None
    if not entry:
        return None
    figures = entry.get(phase) or entry.get("step")
    basis = entry["basis"]
    if not figures and phase == "inference" and entry.get("forward"):  # Note [Inference forward] in optrace.py
        figures, basis = entry["forward"], f"{basis}; training-mode forward rows (no measured inference row)"
    if not figures:
        return None
    if key != "published-inference":  # that basis names its own bench and date (bench/timm_infer_validation.py)
        note = table.get("published_note" if key and key.startswith("published") else "note", "expected_error.json")
        basis = f"{basis} ({note})"
    return ExpectedError(float(figures["median_abs_pct"]), float(figures["p90_abs_pct"]), int(figures["rows"]), basis)


# Note [Published bias per GPU]: the published rows also say how gpemu leans on one GPU. On the GDDR boards (RTX
# 3090 / 4090 / A6000 / 6000 Ada, A10) gpemu reads 7-28 % slower than published in TF32 and AMP, NCHW and NHWC alike
# (docs/cost-model.md, session 9), a bias the path-wide figures above average away. `published_validation.py
# --write` stores, per kind of model ("vision": whole image models; "lm": SQuAD steps and transformer layers) and
# catalog GPU, "published_by_gpu": row count, signed median error (+ = gpemu faster than published) and median
# |error|; `gpemu predict` prints the entry of the model's kind beside a predicted figure for that GPU (an LLM's
# training step: "lm-pretrain", MosaicML's MPT rows from bench/llm_foundry_validation.py, where the GPU has them), and
# a drop-in run's report ends its timing line with every kind's entry for the emulated GPU unless all its GPU time
# was calibrated to measured profiles. Shown, not applied: correcting by it would fit the validation to itself.
@dataclass(frozen=True)
class PublishedBias:
    """How gpemu's predictions compared with the published real-GPU throughputs of one GPU."""

    gpu: str
    model_kind: str
    rows: int
    signed_median_pct: float
    median_abs_pct: float
    basis: str

    def to_json(self) -> dict[str, object]:
        """Return the `predict --json` object."""
        return {"gpu": self.gpu, "model_kind": self.model_kind, "rows": self.rows,
                "signed_median_pct": round(self.signed_median_pct, 2), "median_abs_pct": round(self.median_abs_pct, 2),
                "basis": self.basis}


def published_bias(gpu_key: str, model_kind: str = "vision") -> PublishedBias | None:
    """Return the published rows' verdict on one catalog GPU for one kind of model ("vision", "lm", "lm-pretrain" for
    LLM pretraining steps, or "vision-inference" for inference forwards; Note [Published bias per GPU]), or None."""
    table = load_table()
    entry = table.get("published_by_gpu", {}).get(model_kind, {}).get(gpu_key)
    if not entry:
        return None
    return PublishedBias(gpu_key, model_kind, int(entry["rows"]), float(entry["signed_median_pct"]),
                         float(entry["median_abs_pct"]),
                         str(entry.get("basis") or table.get("published_note", "expected_error.json")))


def published_by_gpu_entries(rows: Iterable[tuple[str, float]], basis: str | None = None) -> dict[str, dict[str, Any]]:
    """Return the published_by_gpu entries of (catalog GPU key, signed % error) rows: per GPU the row count, signed
    median and median |error| (+ = gpemu faster than published), and `basis` when given (Note [Published bias per
    GPU]); the benches' --write stores them."""
    errors: dict[str, list[float]] = {}
    for gpu, error_pct in rows:
        errors.setdefault(gpu, []).append(float(error_pct))
    out: dict[str, dict[str, Any]] = {}
    for gpu, errs in sorted(errors.items()):
        entry: dict[str, Any] = {"rows": len(errs), "signed_median_pct": round(statistics.median(errs), 2),
                                 "median_abs_pct": round(statistics.median(abs(e) for e in errs), 2)}
        if basis is not None:
            entry["basis"] = basis
        out[gpu] = entry
    return out


PUBLISHED_KIND_LABELS = {"vision": "image-model training", "vision-inference": "image-model inference",
                         "lm": "language-model fine-tuning and layers", "lm-pretrain": "LLM pretraining"}


def published_biases(gpu_key: str) -> list[PublishedBias]:
    """Return every kind of model's published verdict on one catalog GPU, in PUBLISHED_KIND_LABELS order."""
    return [b for kind in PUBLISHED_KIND_LABELS if (b := published_bias(gpu_key, kind)) is not None]


def seen_models() -> frozenset[str]:
    """Return the models whose measured rows the packaged fit saw (the validation's rows)."""
    return frozenset(load_table().get("models", ()))
