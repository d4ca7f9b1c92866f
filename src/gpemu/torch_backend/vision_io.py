"""torchvision's GPU image codecs (nvJPEG) under emulation: a clear error instead of the driver's.

Note [nvJPEG]: `torchvision.io.decode_jpeg(data, device="cuda")` and `encode_jpeg` of CUDA tensors call nvJPEG through
`torch.ops.image.decode_jpegs_cuda` / `encode_jpegs_cuda`, which on a machine without a driver died with "CUDA driver
version is insufficient for CUDA runtime version". GPU JPEG decoding is not modelled yet: no measurement of nvJPEG's
throughput (CUDA or the A100/H100 hardware decoder) stands behind a price, and `bench/gpu_micro.py` now measures it on
the next lent GPU (`decode` rows). Until then the calls raise a GpemuError naming the workaround: decode on the CPU
(DataLoader workers, `device="cpu"`) and move the uint8 tensor with `.cuda()`, whose copy is priced. torchvision's
Python functions are wrapped, not the ops in torch.ops.image: a Python function set on an op namespace broke
Inductor's decomposition table for the rest of the process (`torch._dynamo.explain` raised "'CustomDecompTable'
object is not a mapping").
"""

from __future__ import annotations

import functools
from typing import Any

from gpemu.errors import GpemuError

_HINT = ("is not emulated: gpemu has no measured nvJPEG throughput to price it with yet (docs/drop-in.md, Known "
         "limits). Workaround: decode on the CPU (torchvision.io.decode_jpeg(data) in DataLoader workers) and move "
         "the uint8 image with .cuda(), as CPU pipelines do")


def _is_cuda(device: Any) -> bool:
    import torch

    return device is not None and torch.device(device).type == "cuda"


def _decode(orig: Any) -> Any:
    @functools.wraps(orig)
    def decode_jpeg(input: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device", args[1] if len(args) > 1 else None)
        if _is_cuda(device):
            raise GpemuError(f"torchvision.io.decode_jpeg(..., device={str(device)!r}) (nvJPEG) {_HINT}")
        return orig(input, *args, **kwargs)

    return decode_jpeg


def _encode(orig: Any) -> Any:
    @functools.wraps(orig)
    def encode_jpeg(input: Any, *args: Any, **kwargs: Any) -> Any:
        first = input[0] if isinstance(input, (list, tuple)) and input else input
        if getattr(first, "is_cuda", False):
            raise GpemuError(f"torchvision.io.encode_jpeg of a CUDA tensor (nvJPEG) {_HINT}")
        return orig(input, *args, **kwargs)

    return encode_jpeg


def apply(patcher: Any) -> None:
    """Wrap torchvision.io's JPEG codecs so their nvJPEG paths raise a GpemuError (Note [nvJPEG])."""
    try:
        import torchvision.io as tio
        import torchvision.io.image as tio_image
    except Exception:  # no torchvision: nothing to wrap
        return
    for name, wrap in (("decode_jpeg", _decode), ("encode_jpeg", _encode)):
        orig = getattr(tio_image, name, None)
        if orig is None:
            continue
        wrapped = wrap(orig)
        patcher.set(tio_image, name, wrapped)
        if getattr(tio, name, None) is orig:
            patcher.set(tio, name, wrapped)
