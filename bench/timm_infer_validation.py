"""Compare gpemu's inference predictions with timm's published inference throughputs on four recent GeForce / RTX GPUs.

Usage: .venv/bin/python bench/timm_infer_validation.py [--json]   (needs `pip install timm`; prints why and exits
without)

References: huggingface/pytorch-image-models results/benchmark-infer-amp-{nchw,nhwc}-*.csv (bench/_timm_infer_rows.py
names each file and commit): timm's benchmark.py inference runs (model.eval() under torch.no_grad(), AMP fp16
autocast, synthetic input, samples/s at the batch size in the file) on an RTX 3090 and an RTX 4090 with PyTorch 2.4
(NCHW and channels_last), on an RTX 3090 with PyTorch 1.12 (NCHW and channels_last), and on an RTX 4090, an RTX 5090
and an RTX PRO 6000 Blackwell Max-Q with PyTorch 2.9.1 (NCHW). None of these GPUs is in
../shared/data and no fit uses these rows. Predictions: `predict_phase(..., "inference", ..., "amp")` on the spec
path (Note [Inference forward] in gpemu/workloads/optrace.py), the models built by the installed timm (1.0.x; fused
attention on, as timm runs it under PyTorch 2.x). Each row is predicted in its file's layout
(`memory_format=LAYOUT[file]`, Note [Layout cost]). Prints, per file, the errors of the absolute throughput; per
pair of GPUs measured with the same PyTorch, the error of the speed ratio (which cancels a model's own mis-pricing
and tests what the catalog and the model say about the second GPU); and per pair of layouts measured on the same GPU
with the same PyTorch, the error of the NHWC / NCHW speed ratio (which tests the layout cost alone) with the
published ratio's median over the ResNet family. Prints errors, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _timm_infer_rows import LAYOUT, ROWS, SOURCES

GPU_OF_FILE = {"rtx3090-pt240": "rtx3090", "rtx4090-pt240": "rtx4090", "rtx4090-pt291": "rtx4090",
               "rtx5090-pt291": "rtx5090", "pro6000maxq-pt291": "rtx-pro-6000-maxq",
               "rtx3090-pt240-nhwc": "rtx3090", "rtx4090-pt240-nhwc": "rtx4090",
               "rtx3090-pt112": "rtx3090", "rtx3090-pt112-nhwc": "rtx3090"}
# pairs measured with the same software, (slower GPU's file, faster GPU's file)
PAIRS = (("rtx3090-pt240", "rtx4090-pt240"), ("rtx4090-pt291", "rtx5090-pt291"),
         ("rtx4090-pt291", "pro6000maxq-pt291"), ("rtx5090-pt291", "pro6000maxq-pt291"))
# pairs measured on the same GPU with the same software, (NCHW file, channels_last file)
LAYOUT_PAIRS = (("rtx3090-pt240", "rtx3090-pt240-nhwc"), ("rtx4090-pt240", "rtx4090-pt240-nhwc"),
                ("rtx3090-pt112", "rtx3090-pt112-nhwc"))
RESNET_FAMILY = ("resnet", "resnext", "wide_resnet", "seresnet")  # model-name prefixes
IMG_SIZE = 224  # gpemu's zoo input (3 x 224 x 224); rows at other sizes are left out


def _summary(label: str, errors_pct: list[float]) -> str:
    """Return 'label: rows, median |error|, p90 (nearest rank), max, signed median' of signed % errors."""
    if not errors_pct:
        return f"{label}: no rows"
    absolute = sorted(abs(e) for e in errors_pct)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return (f"{label}: {len(errors_pct)} rows, median |error| {statistics.median(absolute):.1f}%, p90 {p90:.1f}%, "
            f"max {absolute[-1]:.1f}%, signed median {statistics.median(errors_pct):+.1f}%")


def _predicted_samples_per_s(gpu: str, name: str, batch: int, memory_format: str) -> float:
    """Return gpemu's predicted inference samples/s of a timm model (AMP, spec path) in `memory_format`."""
    from gpemu.cost.predict import predict_phase

    seconds = predict_phase(gpu, f"_timm_zoo:{name}", "inference", batch, "amp", memory_format=memory_format).value
    return batch / seconds


def _ratio_errors(by: dict[tuple[str, str], dict[str, object]], models: list[str], a: str, b: str) -> list[float]:
    """Return, per model in both files, the % error of the predicted speed ratio b / a against the published one."""
    errs = []
    for m in models:
        ra, rb = by.get((a, m)), by.get((b, m))
        if ra is None or rb is None:
            continue
        pub = float(rb["published_samples_per_s"]) / float(ra["published_samples_per_s"])  # type: ignore[arg-type]
        pred = float(rb["predicted_samples_per_s"]) / float(ra["predicted_samples_per_s"])  # type: ignore[arg-type]
        errs.append(100 * (pred / pub - 1))
    return errs


def _write_expected_error(rows: list[dict[str, object]]) -> None:
    """Store the rows' absolute errors as expected_error.json's "published-inference" path (Note [Expected error])
    and their signed median per GPU as its "vision-inference" published bias (Note [Published bias per GPU])."""
    import numpy as np

    from gpemu.cost.expected_error import EXPECTED_ERROR_PATH, published_by_gpu_entries

    table = json.loads(EXPECTED_ERROR_PATH.read_text())
    errors_pct = [float(r["error_pct"]) for r in rows]  # type: ignore[arg-type]
    absolute = np.abs(np.asarray(errors_pct))
    table["paths"]["published-inference"] = {
        "basis": f"timm's published inference throughputs (AMP, eval, no_grad, NCHW and channels_last, PyTorch "
                 f"1.12 to 2.9), {len(errors_pct)} rows of 38 architectures on RTX 3090 / 4090 / 5090 and RTX PRO "
                 "6000 Max-Q (bench/timm_infer_validation.py, "
                 f"{time.strftime('%Y-%m-%d')})",
        "inference": {"median_abs_pct": round(float(np.median(absolute)), 2),
                      "p90_abs_pct": round(float(np.percentile(absolute, 90)), 2), "rows": len(errors_pct)}}
    # per GPU, the rows of a current PyTorch (2.x), both layouts: what `gpemu predict --mode infer` shows beside a
    # figure for that GPU (Note [Published bias per GPU])
    table.setdefault("published_by_gpu", {})["vision-inference"] = published_by_gpu_entries(
        [(str(r["gpu"]), float(r["error_pct"])) for r in rows if "-pt1" not in str(r["file"])],  # type: ignore[arg-type]
        f"timm's published AMP inference rows, PyTorch 2.4 / 2.9 (bench/timm_infer_validation.py, "
        f"{time.strftime('%Y-%m-%d')})")
    EXPECTED_ERROR_PATH.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {EXPECTED_ERROR_PATH}")


def main() -> None:
    """Print the tables and the summaries."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--write", action="store_true", help="store the errors as the 'published-inference' path of "
                                                        "src/gpemu/cost/expected_error.json (Note [Expected error])")
    args = p.parse_args()
    try:
        import timm  # noqa: F401
    except ImportError:
        print("timm is not installed: `pip install timm` (it leaves torch alone) to run this bench")
        return
    from rich.console import Console
    from rich.table import Table

    from gpemu.hardware import get_gpu

    t0 = time.time()
    out: list[dict[str, object]] = []
    for file_key, name, img_size, published, _step_ms, batch in ROWS:
        if img_size != IMG_SIZE:
            continue
        gpu = GPU_OF_FILE[file_key]
        get_gpu(gpu)  # a catalog entry is required: fail loudly, not silently skip a GPU
        try:
            predicted = _predicted_samples_per_s(gpu, name, batch, LAYOUT[file_key])
        except Exception as exc:  # a model gpemu cannot trace: say so, keep going
            print(f"{name} on {gpu}: not predicted ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        out.append({"file": file_key, "gpu": gpu, "layout": LAYOUT[file_key], "model": name, "batch_size": batch,
                    "published_samples_per_s": published, "predicted_samples_per_s": predicted,
                    "error_pct": 100 * (predicted / published - 1), "source": SOURCES[file_key]})
    if args.write:
        _write_expected_error(out)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    by = {(str(r["file"]), str(r["model"])): r for r in out}
    models = sorted({str(r["model"]) for r in out})
    console = Console(width=160)
    table = Table(title="timm inference throughput (AMP, eval, no_grad; each file's layout): published vs gpemu (spec path), "
                        "samples/s and error (+ = gpemu too fast)")
    table.add_column("model")
    for f in GPU_OF_FILE:
        table.add_column(f, justify="right")
    for m in models:
        cells = []
        for f in GPU_OF_FILE:
            r = by.get((f, m))
            cells.append("-" if r is None else
                         f"{r['published_samples_per_s']:.0f} {float(r['error_pct']):+.0f}%")  # type: ignore[arg-type]
        table.add_row(m, *cells)
    console.print(table)
    print(f"{len(out)} predictions, {len(models)} models; {time.time() - t0:.0f} s")
    for f in GPU_OF_FILE:
        print("  " + _summary(f"{f} ({GPU_OF_FILE[f]}, {LAYOUT[f]})", [float(r["error_pct"]) for r in out if r["file"] == f])
              + f"; {SOURCES[f]}")
    print("speed ratios between GPUs measured with the same PyTorch (+ = gpemu says the second GPU gains more):")
    for a, b in PAIRS:
        print("  " + _summary(f"{GPU_OF_FILE[b]} / {GPU_OF_FILE[a]} ({b} / {a})", _ratio_errors(by, models, a, b)))
    print("NHWC / NCHW speed ratios on the same GPU and PyTorch (+ = gpemu says channels_last gains more):")
    published = {(r[0], r[1]): (r[2], r[3]) for r in ROWS}  # (file, model) -> (img_size, samples/s)
    for a, b in LAYOUT_PAIRS:
        errs = _ratio_errors(by, models, a, b)
        # the published ratio straight from ROWS (every ResNet-family model, predicted or not)
        resnet = [published[(b, m)][1] / published[(a, m)][1] for (f, m) in published
                  if f == a and m.startswith(RESNET_FAMILY) and published.get((b, m), (0, 0))[0] == published[(a, m)][0]]
        predicted_resnet = [float(by[(b, m)]["predicted_samples_per_s"]) / float(by[(a, m)]["predicted_samples_per_s"])  # type: ignore[arg-type]
                            for m in models if m.startswith(RESNET_FAMILY) and (a, m) in by and (b, m) in by]
        family = (f"; published NHWC/NCHW, ResNet family ({len(resnet)} models): median {statistics.median(resnet):.3f}, "
                  f"range {min(resnet):.3f}-{max(resnet):.3f}" if resnet else "")
        if predicted_resnet:
            family += f"; gpemu's median {statistics.median(predicted_resnet):.3f}"
        print("  " + _summary(f"{b} / {a}", errs) + family)


if __name__ == "__main__":
    main()
