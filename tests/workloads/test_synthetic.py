"""Synthetic JPEG folders: ImageFolder layout, real decodable JPEGs, reuse when complete."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from gpemu.workloads.synthetic import make_imagenet_folder, make_jpeg_folder


def test_layout_and_decodable_jpegs(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "ds", n_classes=3, n_per_class=4, size=(64, 48))
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert classes == ["class_000", "class_001", "class_002"]
    files = sorted(root.glob("class_*/*.JPEG"))
    assert len(files) == 12  # 3 classes x 4 images
    with Image.open(files[0]) as img:
        assert img.format == "JPEG" and img.size == (64, 48)


def test_reuses_complete_folder_and_rebuilds_changed_one(tmp_path: Path) -> None:
    root = make_jpeg_folder(tmp_path / "ds", 2, 2, size=(32, 32))
    first = root / "class_000" / "img_00000.JPEG"
    mtime = first.stat().st_mtime_ns
    make_jpeg_folder(tmp_path / "ds", 2, 2, size=(32, 32))
    assert first.stat().st_mtime_ns == mtime  # reused, not rewritten
    make_jpeg_folder(tmp_path / "ds", 2, 3, size=(32, 32))
    assert len(list(root.glob("class_*/*.JPEG"))) == 6  # 2 x 3 after the rebuild


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = make_jpeg_folder(tmp_path / "a", 1, 1, size=(32, 32), seed=7)
    b = make_jpeg_folder(tmp_path / "b", 1, 1, size=(32, 32), seed=7)
    assert (a / "class_000/img_00000.JPEG").read_bytes() == (b / "class_000/img_00000.JPEG").read_bytes()


def test_imagenet_layout(tmp_path: Path) -> None:
    from torchvision.datasets import ImageFolder

    root = make_imagenet_folder(tmp_path / "in", n_classes=2, n_train_per_class=3, n_val_per_class=1, size=(32, 32))
    assert len(ImageFolder(root / "train")) == 6  # 2 x 3
    assert len(ImageFolder(root / "val")) == 2  # 2 x 1
