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
(the gpemu step has momentum); the first forward of each model is traced on meta (~1-5 s each, cached). Prints
errors, not verdicts.
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
GPU = "rtx3090"


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

    from gpemu.cost.predict import predict_phase

    t0 = time.time()
    out = []
    for name, published, batch in ROWS:
        ref = f"_timm_zoo:{name}"  # bench/ is on sys.path when this script runs
        try:
            fwd = predict_phase(GPU, ref, "forward", batch, "amp").value
            bwd = predict_phase(GPU, ref, "backward", batch, "amp").value
        except Exception as exc:  # a model gpemu cannot trace: say so, keep going
            print(f"{name}: not predicted ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        predicted = batch / (fwd + bwd)
        out.append({"model": name, "batch_size": batch, "published_samples_per_s": published,
                    "predicted_samples_per_s": predicted, "error_pct": 100 * (predicted / published - 1),
                    "forward_s": fwd, "backward_s": bwd, "source": SOURCE})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    table = Table(title=f"timm training throughput, {GPU}, AMP NCHW: published vs gpemu (spec path)")
    for col in ("model", "batch", "published /s", "predicted /s", "error"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in out:
        table.add_row(r["model"], str(r["batch_size"]), f"{r['published_samples_per_s']:.0f}",
                      f"{r['predicted_samples_per_s']:.0f}", f"{r['error_pct']:+.1f}%")
    Console(width=120).print(table)
    errors = [abs(r["error_pct"]) for r in out]
    signed = [r["error_pct"] for r in out]
    if errors:
        ranked = sorted(errors)
        p90 = ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]
        print(f"{len(out)} of {len(ROWS)} models: median |error| {statistics.median(errors):.1f}%, p90 {p90:.1f}%, "
              f"max {max(errors):.1f}%, signed median {statistics.median(signed):+.1f}% (+ = gpemu too fast); "
              f"source: {SOURCE}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
