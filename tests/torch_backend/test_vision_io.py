"""torchvision's GPU JPEG codecs under emulation (Note [nvJPEG] in gpemu/torch_backend/vision_io.py)."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt


def test_gpu_jpeg_decoding_names_the_workaround_and_is_restored() -> None:
    """Note [nvJPEG]: torchvision's nvJPEG paths raise a GpemuError with the CPU-decode workaround (before: the
    driver's "CUDA driver version is insufficient"), and uninstall puts torchvision.io back."""
    import io

    import torchvision
    from PIL import Image

    from gpemu.errors import GpemuError

    original = torchvision.io.decode_jpeg
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(buf, format="JPEG")
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    gt.install("a100")
    try:
        with pytest.raises(GpemuError, match="decode on the CPU"):
            torchvision.io.decode_jpeg(data, device="cuda")
        image = torchvision.io.decode_jpeg(data).cuda()  # the workaround
        assert image.shape == (3, 24, 32) and image.is_cuda
        with pytest.raises(GpemuError, match="encode_jpeg of a CUDA tensor"):
            torchvision.io.encode_jpeg(image)
    finally:
        gt.uninstall()
    assert torchvision.io.decode_jpeg is original
