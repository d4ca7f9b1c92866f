"""Time-series forecasting idioms (thuml/Autoformer's AutoCorrelation): FFTs on the device, complex tensors and
cuFFT's half-precision limits (Note [Half-precision FFT sizes] in torch_backend/spectral.py)."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt

# torch's own warning for complex32 (half-precision FFT) tensors: a GPU run prints it too
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
B, H, E, L = 32, 8, 64, 96  # Autoformer on ETTh1: batch 32, 8 heads of 64, seq_len 96


def test_fp16_rfft_over_a_non_power_of_two_raises_as_cufft_does(emu: gt.Emulation) -> None:
    x = torch.randn(4, L, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"powers of two when computing in half precision, .*size of\[96\]"):
        torch.fft.rfft(x, dim=-1)


def test_fp16_fft_over_a_power_of_two_and_fp32_over_any_size_run(emu: gt.Emulation) -> None:
    y = torch.fft.rfft(torch.randn(4, 128, device="cuda", dtype=torch.float16), dim=-1)
    assert y.dtype == torch.complex32 and tuple(y.shape) == (4, 65)  # 128 // 2 + 1 bins
    z = torch.fft.irfft(y, n=128, dim=-1)
    assert z.dtype == torch.float16 and tuple(z.shape) == (4, 128)
    w = torch.fft.irfft(torch.fft.rfft(torch.randn(4, L, device="cuda"), dim=-1), n=L, dim=-1)
    assert w.dtype == torch.float32 and tuple(w.shape) == (4, L)


def test_fp16_irfft_checks_its_output_length(emu: gt.Emulation) -> None:
    # c2r plans the real output: 49 bins back to n=96 is a 96-point transform, not a 49-point one
    bins = torch.fft.rfft(torch.randn(4, 128, device="cuda", dtype=torch.float16), dim=-1)[..., :49]
    with pytest.raises(RuntimeError, match=r"size of\[96\]"):
        torch.fft.irfft(bins, n=L, dim=-1)


def test_autocorrelation_under_autocast_fails_at_seq_len_96_unless_cast_to_fp32(emu: gt.Emulation) -> None:
    # FFTs are not on autocast's fp32 list: the fp16 queries of a Linear reach cuFFT as fp16
    proj = torch.nn.Linear(512, 512).cuda()
    x = torch.randn(B, L, 512, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        q = proj(x).view(B, L, H, E).permute(0, 2, 3, 1).contiguous()
        assert q.dtype == torch.float16
        with pytest.raises(RuntimeError, match="powers of two"):
            torch.fft.rfft(q, dim=-1)
        corr = torch.fft.irfft(torch.fft.rfft(q.float(), dim=-1), n=L, dim=-1)  # the forks' workaround
    assert corr.dtype == torch.float32 and tuple(corr.shape) == (B, H, E, L)


def test_rfft_allocates_its_complex64_bins(emu: gt.Emulation) -> None:
    x = torch.randn(B, H, E, L, device="cuda")
    before = torch.cuda.memory_allocated()
    q_fft = torch.fft.rfft(x, dim=-1)
    # 32 * 8 * 64 series x 49 bins x 8 bytes (complex64) = 6,422,528 bytes
    assert q_fft.dtype == torch.complex64
    assert torch.cuda.memory_allocated() - before == B * H * E * (L // 2 + 1) * 8 == 6_422_528


def test_autocast_linear_on_a_transposed_input_stays_fp16(emu: gt.Emulation) -> None:
    # Note [Linear bias under autocast]: Autoformer's TokenEmbedding returns conv(x).transpose(1, 2); a Linear on it
    # decomposes to mm + add(bias) and the fp32 bias promoted the output back to fp32
    lin = torch.nn.Linear(512, 512).cuda()
    x = torch.randn(B, 512, L, device="cuda").transpose(1, 2)  # (32, 96, 512), not contiguous
    with torch.autocast("cuda", dtype=torch.float16):
        before = torch.cuda.memory_allocated()
        y = lin(x)
        assert y.dtype == torch.float16 and tuple(y.shape) == (B, L, 512)
        # out 32 * 96 * 512 * 2 bytes = 3,145,728 bytes, not the 6,291,456 of an fp32 result
        assert y.element_size() * y.numel() == 3_145_728
        assert torch.cuda.memory_allocated() - before >= 3_145_728
    assert lin.bias.dtype == torch.float32  # the parameter itself is untouched
