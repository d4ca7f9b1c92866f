"""FFT ops (`torch.fft.*` on the device): cuFFT's half-precision limits, checked as a GPU checks them.

Note [Half-precision FFT sizes]
cuFFT computes half-precision transforms (float16 / complex32 signals) only for power-of-two signal sizes, and
PyTorch checks that before it plans one (CuFFTConfig in aten/src/ATen/native/cuda/CuFFTPlanCache.h): an fp16
`torch.fft.rfft` over 96 time steps raises "cuFFT only supports dimensions whose sizes are powers of two when
computing in half precision, but got a signal size of[96]" on every GPU. The meta kernels take any size, so without
this check an fp16 FFT ran under emulation where a GPU stops. The FFT ops are not on autocast's fp32 list, so the
case is common: Autoformer's AutoCorrelation under `--use_amp` with seq_len 96 (its queries come out of an fp16
Linear) fails this way on a GPU, and upstream forks cast to float32 before the FFT. The signal sizes are those cuFFT
plans: the transformed input dims for r2c and c2c, and for c2r the output's (the last one is `last_dim_size`).
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.torch_backend.ops import _special
from gpemu.torch_backend.tensor import run_op

aten = torch.ops.aten
_HALF_DTYPES = (torch.float16, torch.complex32)


def _is_pow_of_two(n: int) -> bool:
    """Return True for 1, 2, 4, 8, ... (cuFFT's `is_pow_of_two`)."""
    return n > 0 and n & (n - 1) == 0


def signal_sizes(func: Any, args: Any, kwargs: Any) -> list[int]:
    """Return the signal sizes cuFFT plans for one `_fft_*` op (Note [Half-precision FFT sizes])."""
    x, dims = args[0], [d % max(args[0].dim(), 1) for d in (args[1] if len(args) > 1 else kwargs["dim"])]
    sizes = [int(x.shape[d]) for d in dims]
    if func is aten._fft_c2r.default:
        sizes[-1] = int(args[3] if len(args) > 3 else kwargs["last_dim_size"])
    return sizes


def check_half_fft(func: Any, args: Any, kwargs: Any) -> None:
    """Raise torch's RuntimeError for a half-precision FFT over a size that is not a power of two."""
    if args[0].dtype not in _HALF_DTYPES:
        return
    sizes = signal_sizes(func, args, kwargs)
    if not all(_is_pow_of_two(n) for n in sizes):
        raise RuntimeError("cuFFT only supports dimensions whose sizes are powers of two when computing in half "
                           f"precision, but got a signal size of{sizes}")


@_special(aten._fft_r2c.default, aten._fft_c2r.default, aten._fft_c2c.default)
def _fft(func: Any, args: Any, kwargs: Any) -> Any:
    check_half_fft(func, args, kwargs)
    return run_op(func, args, kwargs)
