"""Compare gpemu's pricing of torch.compile'd models with timm's published compiled (dynamo) inference throughputs.

Usage: .venv/bin/python bench/timm_compile_validation.py [--json]   (needs `pip install timm`; prints why and exits
without)

References: huggingface/pytorch-image-models results/benchmark-infer-amp-nchw-*-dynamo.csv (bench/_timm_dynamo_rows.py
names each file and commit): timm's benchmark.py inference runs of torch.compile'd models (Inductor; model.eval()
under torch.no_grad(), AMP fp16 autocast, NCHW, synthetic input) on an RTX 4090 with PyTorch 2.4 and 2.9.1, an RTX
5090 and an RTX PRO 6000 Blackwell Max-Q with PyTorch 2.9.1, each next to an eager twin file measured on the same GPU
with the same PyTorch (bench/_timm_infer_rows.py). No fit uses these rows.

gpemu's compiled prediction is the rule of Note [Compiled regions] (gpemu/torch_backend/fusion.py) applied to the
spec path: the eager inference phase prediction (`predict_phase(..., "inference", ..., "amp")`, as
bench/timm_infer_validation.py) times the model's fused fraction, the sum of its inference ops' kernel seconds
charged by `fused_seconds` (consecutive elementwise / norm / reduction / copy ops priced at their group's most
expensive op) over their plain sum, both at the compiled row's batch size. Prints, per file, the errors of the
absolute compiled throughput and, the test of the rule itself, of the compiled / eager speed-up: published (dynamo
row / eager twin row) against gpemu's (compiled prediction / eager prediction, each at its own row's batch size, so
a batch-size difference between the twins is priced, not ignored). It also prints, per model, what Inductor's
layout optimization (torch/_inductor/graph.py, GraphLowering.decide_layout_opt: an inference graph with
convolutions runs channels_last when its conv FLOPs weighted by Inductor's measured channels_last speed-ups are no
more than the plain FLOPs) would choose, and the speed-up error if gpemu priced those models' compiled runs in
channels_last (`memory_format="channels_last"`, Note [Layout cost]); gpemu's rule keeps the eager layout. Prints
errors, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from _timm_dynamo_rows import EAGER_TWIN, ROWS, SOURCES
from _timm_infer_rows import ROWS as EAGER_ROWS
from timm_infer_validation import GPU_OF_FILE, _summary

# Inductor's inference layout heuristic (torch/_inductor/graph.py, decide_layout_opt): channels_last time / NCHW time
# per kind of convolution, "average benchmarked channels last speedup / slowdown, < 1 is speedup"
_CL_MULTIPLIER = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
_NODES_PER_CONV_SKIP = 300  # "Skipped layout opt because only a few conv": graph nodes >= 300 x convolutions


def inductor_channels_last(records: list[Any], graph_inputs: int) -> bool:
    """Return True when Inductor's inference heuristic would run this forward's graph channels_last (traced ops:
    OpRecord-like objects with name, flops, in_shapes = (input, weight, ...); `graph_inputs`: the graph's
    placeholders, parameters and buffers lifted as inputs)."""
    convs = [r for r in records if r.name == "convolution"]
    if not convs or len(records) + graph_inputs + 1 >= _NODES_PER_CONV_SKIP * len(convs):
        return False
    weighted = total = 0.0
    for r in convs:
        x, w = r.in_shapes[0], r.in_shapes[1]
        out_c, in_c_per_group = w[0], w[1]
        groups = x[1] // in_c_per_group
        if groups > 1 and in_c_per_group > 1:
            kind = "grouped"
        elif out_c <= 64 and in_c_per_group <= 64:
            kind = "small"
        elif out_c * 2 <= in_c_per_group and len(w) > 2 and w[2] > 1:
            kind = "in_out"
        else:
            kind = "default"
        weighted += _CL_MULTIPLIER[kind] * r.flops
        total += r.flops
    return weighted <= total


def _fused_fraction(gpu: str, workload: str, batch: int, memory_format: str) -> float:
    """Return fused / unfused kernel seconds of one inference forward (Note [Compiled regions])."""
    from gpemu.cost.predict import phase_op_seconds
    from gpemu.torch_backend.fusion import FUSIBLE_CATEGORIES, fused_seconds

    per_op, categories = phase_op_seconds(gpu, workload, "inference", batch, "amp", memory_format=memory_format)
    fused = fused_seconds([float(s) for s in per_op], [c in FUSIBLE_CATEGORIES for c in categories])
    return sum(fused) / float(per_op.sum())


def _predict(gpu: str, name: str, eager_batch: int, batch: int) -> dict[str, float | bool]:
    """Return gpemu's eager and compiled samples/s for one model (eager at the eager row's batch size, compiled at
    the compiled row's), in NCHW and in the layout Inductor would pick."""
    from gpemu.cost.predict import predict_phase
    from gpemu.workloads.optrace import build_on_meta, trace_inference

    workload = f"_timm_zoo:{name}"
    eager_s = predict_phase(gpu, workload, "inference", eager_batch, "amp").value
    out: dict[str, float | bool] = {"eager_samples_per_s": eager_batch / eager_s}
    for layout in ("nchw", "channels_last"):
        phase_s = predict_phase(gpu, workload, "inference", batch, "amp", memory_format=layout).value
        fraction = _fused_fraction(gpu, workload, batch, layout)
        out[f"{layout}_fused_fraction"] = fraction
        out[f"{layout}_compiled_samples_per_s"] = batch / (phase_s * fraction)
    module = build_on_meta(workload)
    inputs = 1 + sum(1 for _ in module.parameters()) + sum(1 for _ in module.buffers())
    out["inductor_channels_last"] = inductor_channels_last(trace_inference(workload, 8, "amp"), inputs)
    return out


def main() -> None:
    """Print the tables and the summaries."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    try:
        import timm  # noqa: F401
    except ImportError:
        print("timm is not installed: `pip install timm` (it leaves torch alone) to run this bench")
        return
    t0 = time.time()
    eager = {(r[0], r[1]): r for r in EAGER_ROWS}
    out: list[dict[str, Any]] = []
    for file_key, name, _img, published, _step_ms, batch in ROWS:
        twin = EAGER_TWIN[file_key]
        _, _, _, eager_published, _, eager_batch = eager[(twin, name)]
        gpu = GPU_OF_FILE[twin]
        try:
            pred = _predict(gpu, name, eager_batch, batch)
        except Exception as exc:  # a model gpemu cannot trace: say so, keep going
            print(f"{name} on {gpu}: not predicted ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        published_speedup = published / eager_published
        row = {"file": file_key, "gpu": gpu, "model": name, "batch_size": batch, "eager_batch_size": eager_batch,
               "published_samples_per_s": published, "published_eager_samples_per_s": eager_published,
               "published_speedup": published_speedup, **pred, "source": SOURCES[file_key]}
        for layout in ("nchw", "channels_last"):
            compiled = float(pred[f"{layout}_compiled_samples_per_s"])
            row[f"{layout}_error_pct"] = 100 * (compiled / published - 1)
            row[f"{layout}_speedup"] = compiled / float(pred["eager_samples_per_s"])
            row[f"{layout}_speedup_error_pct"] = 100 * (row[f"{layout}_speedup"] / published_speedup - 1)
        # the layout Inductor picks: channels_last where its heuristic says so, else the eager NCHW
        chosen = "channels_last" if pred["inductor_channels_last"] else "nchw"
        row["inductor_layout_speedup_error_pct"] = row[f"{chosen}_speedup_error_pct"]
        out.append(row)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    table = Table(title="timm compiled inference (AMP, eval, no_grad, NCHW): published dynamo / eager speed-up vs "
                        "gpemu's (Note [Compiled regions]); error + = gpemu's speed-up too large")
    for col in ("model", "Inductor layout", "gpemu fused fraction"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for f in SOURCES:
        table.add_column(f.removesuffix("-dynamo"), justify="right")
    for m in sorted({r["model"] for r in out}):
        rs = {r["file"]: r for r in out if r["model"] == m}
        first = next(iter(rs.values()))
        cells = ["channels_last" if first["inductor_channels_last"] else "nchw", f"{first['nchw_fused_fraction']:.3f}"]
        cells += ["-" if f not in rs else f"{rs[f]['published_speedup']:.2f}x {rs[f]['nchw_speedup_error_pct']:+.0f}%"
                  for f in SOURCES]
        table.add_row(m, *cells)
    console.print(table)
    print(f"{len(out)} rows, {len({r['model'] for r in out})} models; {time.time() - t0:.0f} s")
    print("compiled throughput, gpemu (eager phase prediction x fused fraction, NCHW) vs the dynamo rows:")
    for f in SOURCES:
        print("  " + _summary(f"{f} ({GPU_OF_FILE[EAGER_TWIN[f]]})", [r["nchw_error_pct"] for r in out if r["file"] == f])
              + f"; {SOURCES[f]}")
    print("compiled / eager speed-up, gpemu vs published (each file against its eager twin):")
    for f in SOURCES:
        rs = [r for r in out if r["file"] == f]
        print("  " + _summary(f, [r["nchw_speedup_error_pct"] for r in rs])
              + f"; published speed-up median {statistics.median(r['published_speedup'] for r in rs):.2f}x, "
                f"gpemu's {statistics.median(r['nchw_speedup'] for r in rs):.2f}x")
    print("  " + _summary("all files", [r["nchw_speedup_error_pct"] for r in out]))
    for label, pick in (("models Inductor runs channels_last", True), ("models Inductor keeps NCHW", False)):
        rs = [r for r in out if r["inductor_channels_last"] is pick]
        if rs:
            print("  " + _summary(label, [r["nchw_speedup_error_pct"] for r in rs])
                  + f"; published speed-up median {statistics.median(r['published_speedup'] for r in rs):.2f}x, "
                    f"gpemu's {statistics.median(r['nchw_speedup'] for r in rs):.2f}x")
    rs = [r for r in out if r["inductor_channels_last"]]
    if rs:
        print("  " + _summary("models Inductor runs channels_last, priced channels_last (not gpemu's rule)",
                              [r["channels_last_speedup_error_pct"] for r in rs])
              + f"; gpemu's speed-up median {statistics.median(r['channels_last_speedup'] for r in rs):.2f}x")
    print("  " + _summary("all files, priced in the layout Inductor picks (not gpemu's rule)",
                          [r["inductor_layout_speedup_error_pct"] for r in out]))
    worst = sorted(out, key=lambda r: -abs(r["nchw_speedup_error_pct"]))[:10]
    print("largest speed-up errors: " + ", ".join(
        f"{r['model']} on {r['file'].removesuffix('-dynamo')} {r['nchw_speedup_error_pct']:+.0f}% "
        f"(published {r['published_speedup']:.2f}x, gpemu {r['nchw_speedup']:.2f}x)" for r in worst))


if __name__ == "__main__":
    main()
