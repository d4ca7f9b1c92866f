"""Compare gpemu's predictions with published real-GPU throughputs for GPUs, dtypes and layouts not in ../shared.

Usage: .venv/bin/python bench/published_validation.py [--json]

Every reference below is a number a third party measured on real hardware and published; each row names where.
Predictions use only gpemu's packaged model (no profiles): `predict_phase` on the spec path, forward + backward
(GPEmu's "backward" = loss + zero_grad + backward + optimizer step) for training, forward for inference. Caveats the
table cannot hide: NVIDIA's numbers are whole pipelines (DALI data loading, their training script), AMP runs there
use channels_last (NHWC) memory format, which gpemu does not model, and gpemu's inference forward is priced like a
training-mode forward. Prints errors, not verdicts; nothing here is used to fit the model.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from gpemu.cost.predict import predict_phase

DLE = "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md (pytorch-21.03 NGC)"
DLE_CFG = "batch sizes from PyTorch/Classification/ConvNets/configs.yml"
SKB = "sandeepkumar-skb/pytorch_experiments torchvision_exp/README.md (torchvision resnet50, batch 128)"


@dataclass(frozen=True)
class Reference:
    """One published measurement: images per second of a model on a GPU."""

    gpu: str
    model: str
    dtype: str
    mode: str  # "train" (forward + backward + step) or "infer" (forward)
    batch_size: int
    images_per_s: float
    layout: str
    source: str


REFERENCES: tuple[Reference, ...] = (
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 112, 367.0, "NCHW", f"{DLE}, DGX-1 16GB, 1 GPU; {DLE_CFG}"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 112, 356.0, "NCHW", f"{DLE}, DGX-1 32GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 1200.0, "NHWC", f"{DLE}, DGX-1 16GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 256, 1156.0, "NHWC", f"{DLE}, DGX-1 32GB, 1 GPU"),
    Reference("a100-sxm4-80gb", "resnet50", "tf32", "train", 256, 938.0, "NCHW", f"{DLE}, DGX A100 80GB, 1 GPU"),
    Reference("a100-sxm4-80gb", "resnet50", "amp", "train", 256, 2470.0, "NHWC", f"{DLE}, DGX A100 80GB, 1 GPU"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "infer", 256, 1261.0, "NCHW", f"{DLE}, inference, DGX-1 16GB"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "infer", 256, 3382.0, "NHWC", f"{DLE}, inference, DGX-1 16GB"),
    Reference("t4", "resnet50", "fp32", "infer", 256, 415.0, "NCHW", f"{DLE}, inference, T4"),
    Reference("t4", "resnet50", "amp", "infer", 256, 1198.0, "NHWC", f"{DLE}, inference, T4"),
    Reference("v100-sxm2-32gb", "resnet50", "fp32", "train", 128, 128 / 0.34237, "NCHW", f"{SKB}, 342.37 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 128, 128 / 0.15220, "NCHW", f"{SKB}, 152.20 ms/iter"),
    Reference("v100-sxm2-32gb", "resnet50", "amp", "train", 128, 128 / 0.11093, "NHWC", f"{SKB}, 110.93 ms/iter"),
)


def predicted_images_per_s(ref: Reference) -> float:
    """Return gpemu's predicted images per second for one reference configuration."""
    fmt = "channels_last" if ref.layout == "NHWC" else "nchw"
    seconds = predict_phase(ref.gpu, ref.model, "forward", ref.batch_size, ref.dtype, memory_format=fmt).value
    if ref.mode == "train":
        seconds += predict_phase(ref.gpu, ref.model, "backward", ref.batch_size, ref.dtype, memory_format=fmt).value
    return ref.batch_size / seconds


def main() -> None:
    """Print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    args = parser.parse_args()
    rows = []
    for ref in REFERENCES:
        pred = predicted_images_per_s(ref)
        rows.append({**ref.__dict__, "predicted_images_per_s": pred, "error_pct": 100 * (pred / ref.images_per_s - 1)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title="gpemu predictions vs published real-GPU throughput (img/s)")
    for col in ("GPU", "dtype", "mode", "batch", "layout", "published", "predicted", "error", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["gpu"], r["dtype"], r["mode"], str(r["batch_size"]), r["layout"], f"{r['images_per_s']:.0f}",
                      f"{r['predicted_images_per_s']:.0f}", f"{r['error_pct']:+.1f}%", r["source"])
    console = Console(width=200)
    console.print(table)
    for layout in ("NCHW", "NHWC"):
        errs = sorted(abs(r["error_pct"]) for r in rows if r["layout"] == layout)
        if errs:
            console.print(f"{layout}: {len(errs)} rows, median |error| {errs[len(errs) // 2]:.1f}%, max {errs[-1]:.1f}%")


if __name__ == "__main__":
    main()
