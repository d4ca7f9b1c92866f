"""Synthetic data sets on disk: JPEG image folders in torchvision ImageFolder layout (real files, real decode cost)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

MARKER = ".gpemu-synthetic.json"
JPEG_QUALITY = 90  # close to ImageNet's typical JPEG quality


def _image(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    # Smooth colour fields plus fine noise: compresses like a photo (tens of kB at 256x256), unlike pure noise.
    w, h = size
    coarse = rng.integers(0, 256, size=(max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8)
    img = Image.fromarray(coarse, "RGB").resize((w, h), Image.Resampling.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, size=(h, w, 3), dtype=np.int16)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def make_jpeg_folder(
    root: str | Path, n_classes: int, n_per_class: int, size: tuple[int, int] = (256, 256), seed: int = 0
) -> Path:
    """Write n_classes x n_per_class JPEGs as root/class_XXX/img_XXXXX.JPEG (reused if complete); return root."""
    if n_classes < 1 or n_per_class < 1:
        raise ValueError(f"n_classes and n_per_class must be >= 1, got {n_classes}, {n_per_class}")
    root = Path(root)
    spec = {"n_classes": n_classes, "n_per_class": n_per_class, "size": list(size), "seed": seed}
    marker = root / MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text(encoding="utf-8")) == spec:
                return root
        except (OSError, ValueError):
            pass
    # Build beside the target and rename into place, so an interrupted run never leaves a half folder that looks
    # complete.
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for c in range(n_classes):
        class_dir = tmp / f"class_{c:03d}"
        class_dir.mkdir(parents=True)
        for i in range(n_per_class):
            _image(rng, size).save(class_dir / f"img_{c * n_per_class + i:05d}.JPEG", quality=JPEG_QUALITY)
    (tmp / MARKER).write_text(json.dumps(spec), encoding="utf-8")
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, root)
    return root


def make_imagenet_folder(
    root: str | Path, n_classes: int, n_train_per_class: int, n_val_per_class: int,
    size: tuple[int, int] = (256, 256), seed: int = 0,
) -> Path:
    """Write root/train and root/val JPEG folders (the layout pytorch/examples imagenet expects); return root."""
    root = Path(root)
    make_jpeg_folder(root / "train", n_classes, n_train_per_class, size, seed)
    make_jpeg_folder(root / "val", n_classes, n_val_per_class, size, seed + 1)
    return root
