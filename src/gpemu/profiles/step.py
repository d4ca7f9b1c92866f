"""Per-phase figures of one training step (forward, backward, input H2D, memory), each with where it came from."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gpemu.errors import GpemuError, UnknownNameError
from gpemu.estimate import Estimate, missing
from gpemu.hardware import GPUSpec, get_gpu
from gpemu.profiles.db import ProfileDB
from gpemu.profiles.schema import DTYPES

IMAGE_INPUT_BYTES_PER_SAMPLE = 3 * 224 * 224 * 4  # one 3x224x224 fp32 image, as GPEmu copied it
MEMORY_FORMATS = ("nchw", "channels_last")  # profiles are NCHW; channels_last goes through the cost model
TOKEN_BYTES = 8  # one int64 token id; a sample is gpemu.workloads.models.seq_len(model) of them


def known_models(db: ProfileDB) -> list[str]:
    """Return every model name predict accepts: workloads with profile rows plus the built-in model zoo."""
    names = set(db.workloads())
    try:
        from gpemu.workloads.models import list_models
    except ImportError:  # pragma: no cover - zoo not installed
        return sorted(names)
    return sorted(names | set(list_models()))


def check_model(model: str, db: ProfileDB) -> None:
    """Raise UnknownNameError when `model` is neither profiled nor in the zoo (a "module:factory" ref passes)."""
    if ":" in model or model in db.workloads():
        return
    from gpemu.workloads.models import split_seq_len

    base, length = split_seq_len(model)
    if length is not None:  # Note [Sequence length in the model name]
        check_model(base, db)
        workload_kind(model, strict=True)
        return
    choices = known_models(db)
    if model not in choices:
        raise UnknownNameError("model", model, choices)


def workload_kind(model: str, strict: bool = False) -> str:
    """Return "lm" or "vision" (a model unknown to the zoo, only profiled, is one of GPEmu's image classifiers);
    strict=True lets the zoo's error about a bad name through."""
    from gpemu.workloads.models import model_kind

    try:
        return model_kind(model)
    except Exception:
        if strict:
            raise
        return "vision"


def input_bytes(model: str, batch_size: int) -> tuple[int, str]:
    """Return (bytes of one input batch, how it was sized): images 3x224x224 fp32, or seq_len(model) int64 tokens
    (512 by default) for LMs."""
    if workload_kind(model) == "lm":
        from gpemu.workloads.models import seq_len

        per_sample = (tokens := seq_len(model)) * TOKEN_BYTES
        return batch_size * per_sample, f"B x {tokens} int64 tokens = {batch_size} x {per_sample} bytes"
    return batch_size * IMAGE_INPUT_BYTES_PER_SAMPLE, f"B x 3x224x224 fp32 = {batch_size} x 602112 bytes"


def _predicted_phase(spec: GPUSpec, model: str, phase: str, batch_size: int, dtype: str, db: ProfileDB,
                     memory_format: str = "nchw") -> Estimate:
    try:
        from gpemu.cost.predict import predict_phase
    except ImportError:
        return missing("s", "no profile row and no cost model (gpemu.cost.predict) installed")
    try:
        return predict_phase(spec, model, phase, batch_size, dtype=dtype, db=db, memory_format=memory_format)
    except GpemuError as exc:  # e.g. a workload that is profiled elsewhere but unknown to the cost model
        return missing("s", f"no profile row; cost model: {exc}")


def phase_estimate(spec: GPUSpec, model: str, phase: str, batch_size: int, dtype: str, db: ProfileDB,
                   memory_format: str = "nchw") -> Estimate:
    """Return the profile figure for forward/backward, else the cost model's prediction (or missing); profiles are
    NCHW, so a channels_last step is always the cost model's (scaled from a profile where one exists)."""
    if memory_format != "nchw":
        return _predicted_phase(spec, model, phase, batch_size, dtype, db, memory_format)
    est = db.lookup(spec, model, phase, batch_size, dtype)
    return est if est.ok else _predicted_phase(spec, model, phase, batch_size, dtype, db)


def h2d_estimate(spec: GPUSpec, model: str, batch_size: int, dtype: str, db: ProfileDB) -> Estimate:
    """Return the pageable H2D seconds of one input batch: profile row, else bytes / spec.h2d_pageable_gbps."""
    est = db.lookup(spec, model, "h2d_pageable", batch_size, dtype)
    if est.ok:
        return est
    if dtype != "fp32":  # the loader hands over the same fp32 batch whatever precision the model computes in
        est = db.lookup(spec, model, "h2d_pageable", batch_size, "fp32")
        if est.ok:
            return replace(est, source=f"{est.source} (fp32 row: the input batch is fp32 whatever the compute dtype)")
    size_bytes, how = input_bytes(model, batch_size)
    seconds = size_bytes / (spec.h2d_pageable_gbps * 1e9)
    return Estimate(
        seconds,
        "s",
        "predicted",
        source=f"{how} / {spec.h2d_pageable_gbps} GB/s pageable H2D of {spec.key} (gpus.toml)",
        path="spec-h2d-bandwidth",
        details={"bytes": size_bytes},
    )


def memory_estimate(spec: GPUSpec, model: str, batch_size: int, dtype: str, db: ProfileDB,
                    mode: str = "train") -> dict[str, Any] | None:
    """Return {peak_mib, persistent_mib, source, provenance} from profile rows (training only), else gpemu.memory,
    else None."""
    if mode == "train":  # profiles measure training steps
        peak = db.lookup(spec, model, "mem_peak", batch_size, dtype)
        persistent = db.lookup(spec, model, "mem_persistent", batch_size, dtype)
        if peak.ok and persistent.ok:
            kinds = [peak.kind, persistent.kind]
            worst = max(kinds, key=["measured", "interpolated", "extrapolated"].index)
            return {"peak_mib": peak.value, "persistent_mib": persistent.value, "source": worst,
                    "provenance": peak.source}
    try:
        from gpemu.memory import predict_memory  # type: ignore[attr-defined]
    except ImportError:
        try:
            from gpemu.memory.predict import predict_memory
        except ImportError:
            return None
    try:
        mem = predict_memory(spec, model, batch_size, dtype, mode=mode)
    except Exception as exc:  # a model the memory simulator cannot build: say so rather than crash predict
        return {"peak_mib": None, "persistent_mib": None, "source": "missing", "provenance": f"memory model: {exc}"}
    return {
        "peak_mib": mem["peak_mib"],
        "persistent_mib": mem["persistent_mib"],
        "fits": mem.get("fits"),  # reserved peak + CUDA context within the device's memory
        "source": "predicted",
        "provenance": str(mem.get("source", "gpemu.memory.predict_memory")),
    }


def _json_phase(est: Estimate, trust: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = dict(est.to_json())
    if "seconds" not in out:  # a missing estimate has an empty or odd unit
        out = {"seconds": est.value, **{k: v for k, v in out.items() if k != est.unit}}
    if isinstance(out["seconds"], float) and math.isnan(out["seconds"]):
        out["seconds"] = None
    if trust is not None:
        out["expected_error"] = trust.to_json()
    return out


def phase_expected_error(est: Estimate, model: str, phase: str, dtype: str, spec: GPUSpec | None = None) -> Any:
    """Return the ExpectedError of the path behind a forward/backward estimate, or None (measured, missing, or no
    validation of that path). See Note [Expected error] in gpemu.cost.expected_error."""
    if not est.ok:
        return None
    if spec is not None and dtype in ("bf16", "amp_bf16") and not spec.peak_tflops.get("bf16", 0.0):
        return None  # bf16 without bf16 tensor cores (V100, T4): CUDA-core paths no published row has validated
    try:
        from gpemu.cost.expected_error import expected_error, seen_models
    except ImportError:  # pragma: no cover - cost package not installed
        return None
    return expected_error(est.path, est.kind, phase, dtype, workload_kind(model), model in seen_models())


MODES: tuple[str, ...] = ("train", "infer")


def predict_step(
    gpu: str | GPUSpec, model: str, batch_size: int, dtype: str = "fp32", db: ProfileDB | None = None,
    memory_format: str = "nchw", mode: str = "train",
) -> dict[str, Any]:
    """Return the `gpemu predict --json` object: per-phase seconds with their source, and memory (or None);
    memory_format "channels_last" prices an NHWC model (Note [Layout cost] in gpemu.cost.model); mode "infer" prices
    one inference forward (model.eval(), no_grad: Note [Inference forward] in gpemu.workloads.optrace) instead of a
    training step's forward and backward."""
    if mode not in MODES:
        raise UnknownNameError("mode", mode, MODES)
    spec = get_gpu(gpu)
    db = ProfileDB.default() if db is None else db
    if dtype not in DTYPES:
        raise UnknownNameError("dtype", dtype, DTYPES)
    if memory_format not in MEMORY_FORMATS:
        raise GpemuError(f"unknown memory format {memory_format!r}: use one of {', '.join(MEMORY_FORMATS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise GpemuError(f"batch size must be an integer >= 1, got {batch_size!r}")
    check_model(model, db)
    if mode == "infer":  # profiles hold training phases: an inference forward is always the cost model's
        phases = {"inference": _predicted_phase(spec, model, "inference", batch_size, dtype, db, memory_format)}
        memory = memory_estimate(spec, model, batch_size, dtype, db, mode)
    else:
        phases = {
            "forward": phase_estimate(spec, model, "forward", batch_size, dtype, db, memory_format),
            "backward": phase_estimate(spec, model, "backward", batch_size, dtype, db, memory_format),
        }
        memory = memory_estimate(spec, model, batch_size, dtype, db)
    phases["h2d"] = h2d_estimate(spec, model, batch_size, dtype, db)
    return {
        "gpu": spec.key,
        "model": model,
        "batch_size": batch_size,
        "dtype": dtype,
        "memory_format": memory_format,
        "mode": mode,
        "seq_len": _seq_len_or_none(model),
        "phases": {name: _json_phase(est, phase_expected_error(est, model, name, dtype, spec) if name != "h2d" else None)
                   for name, est in phases.items()},
        "memory": memory,
        "published_bias": _published_bias(spec.key, workload_kind(model), mode),
    }


def _seq_len_or_none(model: str) -> int | None:
    """Return a language model's tokens per sample (Note [Sequence length in the model name]); None for images."""
    if workload_kind(model) != "lm":
        return None
    from gpemu.workloads.models import seq_len

    return seq_len(model)


def _published_bias(gpu_key: str, model_kind: str, mode: str = "train") -> dict[str, object] | None:
    """Return the published rows' signed median error on this GPU for this kind of model (Note [Published bias per
    GPU]; an inference forward of an image model: the inference rows, a language model's training step: the LLM
    pretraining rows, where that GPU has some), or None."""
    try:
        from gpemu.cost.expected_error import published_bias
    except ImportError:  # pragma: no cover - cost package not installed
        return None
    specific = {("infer", "vision"): "vision-inference", ("train", "lm"): "lm-pretrain"}.get((mode, model_kind))
    bias = published_bias(gpu_key, specific) if specific else None
    bias = bias or published_bias(gpu_key, model_kind)
    return None if bias is None else bias.to_json()
