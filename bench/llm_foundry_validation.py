"""Compare gpemu's predictions with MosaicML's published MPT pretraining throughputs on A100 and H100 (125M-30B).

Usage: .venv/bin/python bench/llm_foundry_validation.py [--json] [--write]

References: bench/_llm_foundry_rows.py (llm-foundry's benchmarking README: MPT models, 8 GPUs of one node, FSDP
FULL_SHARD, bf16, triton flash attention, 512 to 65,536 tokens per sequence), models rebuilt op for op in
bench/_mpt_model.py (parameter counts equal to the tables'). None of these GPUs is in ../shared/data and no fit uses
these rows. Prediction per row, spec path: one micro-batch's forward + backward (`predict_phase(..., "forward")` +
`"backward_only"`), a second forward where the row checkpoints activations (Composer recomputes every block's
forward during the backward), tokens/s/GPU = micro_batch x seq_len / that time. Not priced: FSDP's all-gathers and
reduce-scatters (overlapped with compute, over NVLink within the node), the optimizer step (each GPU updates 1/8 of
the weights once per grad_accum micro-batches: under 1 % of a step at these sizes), the data loader. So the
prediction is a single GPU's compute, and a positive error (gpemu faster) up to the unpriced overheads is expected.
Prints per row, and per GPU for three groups: rows at <= 4096 tokens without checkpointing (GEMM-dominated: what
the comparison tests), the same lengths with checkpointing (the tables' HFU, which assumes one full recomputed
forward, reaches 74-79 % of the A100's peak on them, above any GEMM the GEMM table measured, so Composer's recompute
is likely partial and these rows read gpemu slow), and 8,192-65,536 tokens (attention-dominated: MPT's triton
flash-attention kernel of 2023, not the FlashAttention-2 kernel PyTorch's SDPA runs, whose efficiency gpemu prices;
Note [Fused attention efficiency]). Then the H100 / A100-80GB speed ratio on the rows both tables have (same model,
length, micro-batch and checkpointing), which cancels a model's own mis-pricing. `--write` stores the first group's
per-GPU errors as published_by_gpu["lm-pretrain"] in src/gpemu/cost/expected_error.json, which `gpemu predict` shows
beside a language model's training figure on those GPUs (Note [Published bias per GPU]).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

from _llm_foundry_rows import ROWS, SOURCE, TABLES

HERE = Path(__file__).resolve().parent
SHORT_SEQ_LEN = 4096  # tokens; longer rows are dominated by MPT's triton attention kernel, not PyTorch's SDPA


def _summary(label: str, errors_pct: list[float]) -> str:
    """Return 'label: rows, median |error|, p90 (nearest rank), max, signed median' of signed % errors."""
    if not errors_pct:
        return f"{label}: no rows"
    absolute = sorted(abs(e) for e in errors_pct)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return (f"{label}: {len(errors_pct)} rows, median |error| {statistics.median(absolute):.1f}%, p90 {p90:.1f}%, "
            f"max {absolute[-1]:.1f}%, signed median {statistics.median(errors_pct):+.1f}%")


def _short(row: dict[str, object]) -> bool:
    """Return whether a row is at <= SHORT_SEQ_LEN tokens (GEMM-dominated: Note in the module docstring)."""
    return int(row["seq_len"]) <= SHORT_SEQ_LEN  # type: ignore[call-overload]


def _use_private_trace_cache() -> None:
    """Trace the MPT factories into a cache keyed by bench/_mpt_model.py's text: the optrace cache keys factory refs
    by name only, so an edited model would otherwise be priced from its old traces."""
    from gpemu.paths import CACHE_DIR_ENV, cache_dir

    digest = hashlib.sha1((HERE / "_mpt_model.py").read_bytes()).hexdigest()[:12]
    os.environ[CACHE_DIR_ENV] = str(cache_dir() / f"bench-mpt-{digest}")


def predicted_tokens_per_s(gpu: str, size: str, seq_len: int, micro_batch: int, dtype: str, act_ckpt: bool) -> dict:
    """Return gpemu's tokens/s for one GPU's micro-batch step of an MPT model, with its phase times in ms."""
    from gpemu.cost.predict import predict_phase

    workload = f"_mpt_model:mpt_{size}_s{seq_len}@{seq_len}"
    fwd = predict_phase(gpu, workload, "forward", micro_batch, dtype).value
    bwd = predict_phase(gpu, workload, "backward_only", micro_batch, dtype).value
    step = fwd * (2 if act_ckpt else 1) + bwd
    return {"tokens_per_s": micro_batch * seq_len / step, "forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3}


def _write(rows: list[dict[str, object]]) -> None:
    from gpemu.cost.expected_error import EXPECTED_ERROR_PATH, published_by_gpu_entries

    table = json.loads(EXPECTED_ERROR_PATH.read_text())
    kept = [(str(r["gpu"]), float(r["error_pct"])) for r in rows  # type: ignore[arg-type]
            if _short(r) and not r["act_ckpt"]]  # the rows that test what gpemu prices (module docstring)
    table.setdefault("published_by_gpu", {})["lm-pretrain"] = published_by_gpu_entries(
        kept, f"MosaicML's published MPT pretraining throughputs, 125M-30B, 512-4096 tokens, 8 GPUs, FSDP, bf16, no "
              f"activation checkpointing (bench/llm_foundry_validation.py, {time.strftime('%Y-%m-%d')})")
    EXPECTED_ERROR_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {EXPECTED_ERROR_PATH}")


def main() -> None:
    """Print the table and the summaries."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--write", action="store_true", help="store the per-GPU errors as published_by_gpu['lm-pretrain'] "
                                                        "in src/gpemu/cost/expected_error.json")
    args = p.parse_args()
    _use_private_trace_cache()
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    t0 = time.time()
    out: list[dict[str, object]] = []
    for table_key, size, seq_len, mb, ga, published, mfu, ckpt in track(ROWS, description="pricing MPT rows",
                                                                        transient=True):
        gpu, dtype = TABLES[table_key]
        pred = predicted_tokens_per_s(gpu, size, seq_len, mb, dtype, ckpt)
        out.append({"table": table_key, "gpu": gpu, "dtype": dtype, "model": size, "seq_len": seq_len,
                    "micro_batch": mb, "grad_accum": ga, "act_ckpt": ckpt, "published_tokens_per_s": published,
                    "published_mfu_pct": mfu, **{k: round(v, 2) for k, v in pred.items()},
                    "error_pct": round(100 * (pred["tokens_per_s"] / published - 1), 2)})
    if args.json:
        print(json.dumps(out, indent=1))
    console = Console(width=150)
    tab = Table(title=f"MPT pretraining, tokens/s per GPU: published vs gpemu (+ = gpemu faster); {SOURCE}")
    for col in ("GPU", "dtype", "model", "seq", "micro-batch", "ckpt", "published", "MFU %", "gpemu", "error"):
        tab.add_column(col, justify="right" if col not in ("GPU", "dtype", "model") else "left")
    for r in out:
        tab.add_row(str(r["gpu"]), str(r["dtype"]), str(r["model"]), str(r["seq_len"]), str(r["micro_batch"]),
                    "yes" if r["act_ckpt"] else "", f"{r['published_tokens_per_s']:.0f}", f"{r['published_mfu_pct']}",
                    f"{r['tokens_per_s']:.0f}", f"{r['error_pct']:+.1f}%")
    console.print(tab)
    for table_key, (gpu, _dtype) in TABLES.items():
        mine = [r for r in out if r["table"] == table_key]
        print(_summary(f"  {gpu} ({table_key})", [float(r["error_pct"]) for r in mine]))  # type: ignore[arg-type]
        for label, keep in (("<= 4096 tokens, no checkpointing", lambda r: _short(r) and not r["act_ckpt"]),
                            ("<= 4096 tokens, checkpointing", lambda r: _short(r) and r["act_ckpt"]),
                            ("8192-65536 tokens", lambda r: not _short(r))):
            print(_summary(f"    {label}", [float(r["error_pct"]) for r in mine if keep(r)]))  # type: ignore[arg-type]
    print(_summary("  <= 4096 tokens, no checkpointing, all GPUs",
                   [float(r["error_pct"]) for r in out if _short(r) and not r["act_ckpt"]]))  # type: ignore[arg-type]
    print(_summary("  all rows", [float(r["error_pct"]) for r in out]))  # type: ignore[arg-type]
    # the H100 / A100 speed ratio where both tables ran the same configuration
    a100 = {(r["model"], r["seq_len"], r["micro_batch"], r["act_ckpt"]): r for r in out if r["table"] == "a100-80gb"}
    ratio_errs = []
    for r in out:
        key = (r["model"], r["seq_len"], r["micro_batch"], r["act_ckpt"])
        if r["table"] == "h100" and key in a100:
            pub = float(r["published_tokens_per_s"]) / float(a100[key]["published_tokens_per_s"])  # type: ignore[arg-type]
            pred = float(r["tokens_per_s"]) / float(a100[key]["tokens_per_s"])  # type: ignore[arg-type]
            ratio_errs.append(100 * (pred / pub - 1))
            print(f"  H100 / A100-80GB {key[0]} @ {key[1]} mb {key[2]}: published {pub:.2f}x, gpemu {pred:.2f}x "
                  f"({ratio_errs[-1]:+.1f}%)")
    print(_summary("  H100 / A100-80GB speed ratio", ratio_errs))
    print(f"done in {time.time() - t0:.0f} s")
    if args.write:
        _write(out)


if __name__ == "__main__":
    main()
