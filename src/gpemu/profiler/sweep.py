"""Sweep specifications: parsing batch-size, model and dtype lists, and the GPEmu model set."""

from __future__ import annotations

import re

from gpemu.errors import GpemuError, UnknownNameError

# The GPEmu torchvision set: the 30 CNNs in ../shared/data/gpemu-profiles plus the six GPEmu's paper also lists
# (inception_v3, mnasnet1_0, mobilenet_v3_large, resnext50_32x4d, shufflenet_v2_x1_5, vgg13_bn) = 36.
GPEMU_VISION_MODELS: tuple[str, ...] = (
    "alexnet",
    "densenet121",
    "densenet161",
    "densenet201",
    "googlenet",
    "inception_v3",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "wide_resnet50_2",
    "wide_resnet101_2",
)
LANGUAGE_MODELS: tuple[str, ...] = ("bert-base", "gpt2")

# What each dtype label means when profiling (see docs/profiler.md):
#   fp32     torch defaults (cuDNN conv may use TF32 on Ampere+, matmul TF32 off), fp32 weights and inputs
#   tf32     TF32 allowed for both matmul and cuDNN
#   fp16/bf16  model and inputs cast to that dtype
#   amp      torch.autocast(float16) + GradScaler, fp32 master weights
#   amp_bf16 torch.autocast(bfloat16), no scaler
PROFILE_DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "amp", "amp_bf16")

_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


def parse_batch_sizes(text: str) -> list[int]:
    """Return the sorted batch sizes of a spec like "1-8,16,32", "pow2:1-256" or "1,2,4"."""
    sizes: set[int] = set()
    for raw in text.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        if part.startswith("pow2:"):
            lo, hi = _bounds(part[5:], text)
            p = 1
            while p <= hi:
                if p >= lo:
                    sizes.add(p)
                p *= 2
        elif _RANGE.match(part):
            lo, hi = _bounds(part, text)
            sizes.update(range(lo, hi + 1))
        elif part.isdigit():
            sizes.add(int(part))
        else:
            raise GpemuError(f"bad batch-size spec {text!r}: {raw.strip()!r} is not N, A-B or pow2:A-B")
    if not sizes or min(sizes) < 1:
        raise GpemuError(f"bad batch-size spec {text!r}: batch sizes must be integers >= 1")
    return sorted(sizes)


def _bounds(part: str, text: str) -> tuple[int, int]:
    match = _RANGE.match(part.strip())
    if not match:
        raise GpemuError(f"bad batch-size spec {text!r}: {part!r} is not a range A-B")
    lo, hi = int(match.group(1)), int(match.group(2))
    if lo < 1 or hi < lo:
        raise GpemuError(f"bad batch-size spec {text!r}: range {part!r} must satisfy 1 <= A <= B")
    return lo, hi


def parse_names(text: str) -> list[str]:
    """Return the comma-separated names in `text`, stripped, order kept, duplicates dropped."""
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if name and name not in out:
            out.append(name)
    if not out:
        raise GpemuError(f"empty list {text!r}")
    return out


def parse_dtypes(text: str) -> list[str]:
    """Return the dtype labels in `text`; raise UnknownNameError for one the profiler does not know."""
    out = parse_names(text.lower())
    for name in out:
        if name not in PROFILE_DTYPES:
            raise UnknownNameError("dtype", name, PROFILE_DTYPES)
    return out
