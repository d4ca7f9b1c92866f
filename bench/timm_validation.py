"""Compare gpemu's predictions with timm's published training throughputs: many architectures, a GPU not in ../shared.

Usage: .venv/bin/python bench/timm_validation.py [--json]   (needs `pip install timm`; prints why and exits without)

Reference: huggingface/pytorch-image-models results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv @ 5e7d47ca
(timm's benchmark.py: training steps of random-init models on synthetic 224 px images, AMP with a gradient scaler,
NCHW, PyTorch 1.12 / CUDA 11.3, one RTX 3090; samples/s at the batch size timm chose per model). The rows below are
the models at 224 px across families (ResNets, ResNeXt, DenseNet, VGG, MobileNets, EfficientNet, RegNets, ViT, DeiT
era transformers, ConvNeXt, Swin, MLP-Mixer, PoolFormer, XCiT, LeViT, CaiT, BEiT, GhostNet), none of which is in
GPEmu's measured data as measured on this GPU. Predictions: `predict_phase` (spec path: no profile of the RTX 3090)
for forward + backward (GPEmu's backward = loss + zero_grad + backward + SGD step) in "amp", the model built by timm
1.0.x with fused attention off (TIMM_FUSED_ATTN=0: the 2022 timm that measured these ran attention as explicit
matmuls and softmax). Caveats: timm's implementations changed a little since 2022; benchmark.py's optimizer is SGD
(the gpemu step has momentum); the first forward of each model is traced on meta (~1-5 s each, cached). The same
34 runs in channels_last (NHWC_SOURCE, session 9) give a second throughput per model and the NHWC / NCHW speed
ratio, which tests Note [Layout cost] without the GPU's absolute speed. Prints errors, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SOURCE = ("huggingface/pytorch-image-models results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv @ "
          "5e7d47ca105a59a39778102d3276291d6db5dd32")

# (timm model, published train samples/s, train batch size): the file's rows at train_img_size 224
ROWS: tuple[tuple[str, float, int], ...] = (
    ("resnet18", 2764.22, 512), ("resnet34", 1622.41, 512), ("resnet50", 826.06, 512), ("resnet101", 568.98, 256),
    ("resnet152", 370.08, 192), ("resnext50_32x4d", 663.39, 384), ("wide_resnet50_2", 495.68, 384),
    ("seresnet50", 714.65, 384), ("densenet121", 730.11, 256), ("densenet201", 447.44, 192), ("vgg16", 465.36, 384),
    ("mobilenetv2_100", 1832.14, 512), ("mobilenetv3_large_100", 2167.29, 512), ("efficientnet_b0", 1459.11, 384),
    ("mnasnet_100", 2053.84, 512), ("ghostnet_100", 1601.5, 512), ("regnety_016", 954.26, 512),
    ("regnety_032", 696.58, 384), ("regnetx_032", 787.5, 384), ("vit_tiny_patch16_224", 2293.54, 512),
    ("vit_small_patch16_224", 1052.92, 384), ("vit_base_patch16_224", 390.86, 192),
    ("vit_base_patch32_224", 1703.57, 512), ("convnext_tiny", 813.16, 256), ("convnext_small", 489.81, 192),
    ("convnext_base", 336.98, 128), ("swin_tiny_patch4_window7_224", 646.76, 256),
    ("swin_small_patch4_window7_224", 399.67, 192), ("mixer_b16_224", 528.02, 256), ("poolformer_s12", 1234.11, 512),
    ("xcit_tiny_12_p16_224", 1323.84, 512), ("levit_128", 3895.0, 512), ("cait_xxs24_224", 576.52, 256),
    ("beit_base_patch16_224", 358.29, 192),
)
# The same runs in channels_last (benchmark.py --channels-last): NHWC_SOURCE, the same 34 models
NHWC_SOURCE = ("huggingface/pytorch-image-models results/benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv @ "
               "c865028c34fc05cc7deea8e753b30d8cd1952591")
NHWC: dict[str, tuple[float, int]] = {  # model -> (published NHWC train samples/s, batch size)
    "resnet18": (3481.78, 512), "resnet34": (2036.51, 512), "resnet50": (1218.01, 512), "resnet101": (747.89, 256),
    "resnet152": (501.44, 192), "resnext50_32x4d": (1001.03, 384), "wide_resnet50_2": (668.78, 384),
    "seresnet50": (971.79, 384), "densenet121": (913.65, 256), "densenet201": (562.52, 192), "vgg16": (546.06, 384),
    "mobilenetv2_100": (2313.1, 512), "mobilenetv3_large_100": (2732.43, 512), "efficientnet_b0": (1751.72, 512),
    "mnasnet_100": (2929.31, 512), "ghostnet_100": (2129.82, 512), "regnety_016": (650.07, 512),
    "regnety_032": (496.85, 384), "regnetx_032": (308.88, 384), "vit_tiny_patch16_224": (2299.56, 512),
    "vit_small_patch16_224": (1057.92, 384), "vit_base_patch16_224": (392.99, 192),
    "vit_base_patch32_224": (1708.63, 512), "convnext_tiny": (819.24, 256), "convnext_small": (487.15, 192),
    "convnext_base": (338.68, 128), "swin_tiny_patch4_window7_224": (648.69, 256),
    "swin_small_patch4_window7_224": (400.37, 192), "mixer_b16_224": (556.6, 256), "poolformer_s12": (1342.54, 512),
    "xcit_tiny_12_p16_224": (1426.18, 512), "levit_128": (4558.28, 512), "cait_xxs24_224": (593.22, 256),
    "beit_base_patch16_224": (358.77, 192),
}
GPU = "rtx3090"


def _summary(label: str, errors_pct: list[float]) -> str:
    """Return 'label: median |error|, p90 (nearest rank), max, signed median' of signed % errors."""
    absolute = sorted(abs(e) for e in errors_pct)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return (f"{label}: {len(errors_pct)} rows, median |error| {statistics.median(absolute):.1f}%, p90 {p90:.1f}%, "
            f"max {absolute[-1]:.1f}%, signed median {statistics.median(errors_pct):+.1f}%")


def _throughput(name: str, batch: int, memory_format: str) -> float:
    """Return gpemu's predicted training samples/s (forward + backward, "amp") of a timm model on the RTX 3090."""
    from gpemu.cost.predict import predict_phase

    ref = f"_timm_zoo:{name}"  # bench/ is on sys.path when this script runs
    step_s = sum(predict_phase(GPU, ref, phase, batch, "amp", memory_format=memory_format).value
                 for phase in ("forward", "backward"))
    return batch / step_s


def main() -> None:
    """Print the table and the summary."""
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    os.environ.setdefault("TIMM_FUSED_ATTN", "0")
    try:
        import timm  # noqa: F401
    except ImportError:
        print("timm is not installed: `pip install timm` (it leaves torch alone) to run this bench")
        return
    from rich.console import Console
    from rich.table import Table

    t0 = time.time()
    out = []
    for name, published, batch in ROWS:
        nhwc_published, nhwc_batch = NHWC[name]
        try:
            predicted = _throughput(name, batch, "nchw")
            nhwc_predicted = _throughput(name, nhwc_batch, "channels_last")
        except Exception as exc:  # a model gpemu cannot trace: say so, keep going
            print(f"{name}: not predicted ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        out.append({"model": name, "batch_size": batch, "published_samples_per_s": published,
                    "predicted_samples_per_s": predicted, "error_pct": 100 * (predicted / published - 1),
                    "nhwc_batch_size": nhwc_batch, "nhwc_published_samples_per_s": nhwc_published,
                    "nhwc_predicted_samples_per_s": nhwc_predicted,
                    "nhwc_error_pct": 100 * (nhwc_predicted / nhwc_published - 1),
                    # NHWC / NCHW speed ratio, predicted against published (per sample: the batches may differ)
                    "ratio_error_pct": 100 * ((nhwc_predicted / predicted) / (nhwc_published / published) - 1),
                    "source": SOURCE, "nhwc_source": NHWC_SOURCE})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    table = Table(title=f"timm training throughput, {GPU}, AMP: published vs gpemu (spec path), NCHW and NHWC")
    for col in ("model", "batch", "NCHW pub /s", "pred /s", "error", "NHWC pub /s", "pred /s", "error",
                "NHWC/NCHW pub", "pred"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in out:
        table.add_row(r["model"], str(r["batch_size"]), f"{r['published_samples_per_s']:.0f}",
                      f"{r['predicted_samples_per_s']:.0f}", f"{r['error_pct']:+.1f}%",
                      f"{r['nhwc_published_samples_per_s']:.0f}", f"{r['nhwc_predicted_samples_per_s']:.0f}",
                      f"{r['nhwc_error_pct']:+.1f}%",
                      f"{r['nhwc_published_samples_per_s'] / r['published_samples_per_s']:.2f}",
                      f"{r['nhwc_predicted_samples_per_s'] / r['predicted_samples_per_s']:.2f}")
    Console(width=150).print(table)
    if out:
        print(f"{len(out)} of {len(ROWS)} models (+ = gpemu too fast); {time.time() - t0:.0f} s")
        print("  " + _summary("NCHW", [r["error_pct"] for r in out]) + f"; {SOURCE}")
        print("  " + _summary("NHWC", [r["nhwc_error_pct"] for r in out]) + f"; {NHWC_SOURCE}")
        print("  " + _summary("NHWC / NCHW speed ratio", [r["ratio_error_pct"] for r in out]))


if __name__ == "__main__":
    main()
