"""In-place metadata ops (unsqueeze_, transpose_, squeeze_, t_) on emulated tensors, and the torch ops built on them."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt


def test_inplace_view_ops_restride_the_wrapper(emu: gt.Emulation) -> None:
    x = torch.randn(3, 4, device="cuda")
    x.unsqueeze_(0)  # the inference idiom img.unsqueeze_(0)
    assert x.shape == (1, 3, 4) and x.stride() == (12, 4, 1)
    x.transpose_(1, 2)
    assert x.shape == (1, 4, 3) and x.stride() == (12, 1, 4) and not x.is_contiguous()
    assert x.contiguous().stride() == (12, 3, 1)
    x.squeeze_(0).t_()
    assert x.shape == (3, 4) and (x + 1).shape == (3, 4)  # a cached op keyed on the new shape
    before = emu.devices[0].allocator.memory_allocated()
    x.unsqueeze_(-1)
    assert emu.devices[0].allocator.memory_allocated() == before  # metadata only: no new memory


def test_inplace_view_under_autograd(emu: gt.Emulation) -> None:
    w = torch.randn(5, 6, device="cuda", requires_grad=True)
    z = w * 2
    z.unsqueeze_(0)
    z.sum().backward()
    assert z.shape == (1, 5, 6) and w.grad is not None and w.grad.shape == (5, 6)


def test_stft_and_quantile(emu: gt.Emulation) -> None:
    window = torch.hann_window(64, device="cuda")
    spec = torch.stft(torch.randn(2, 400, device="cuda"), 64, return_complex=True, window=window)
    # n_fft 64 -> 33 bins; hop 64 // 4 = 16, centred: 1 + 400 // 16 = 26 frames
    assert spec.shape == (2, 33, 26) and spec.is_complex()
    # istft's C++ window-envelope check (is_scalar_tensor_true: equal(cond, ones)) reads the check result as False
    assert torch.istft(spec, 64, window=window).shape == (2, 400)
    assert torch.equal(spec.abs(), spec.abs())  # plain torch.equal still answers by shape
    assert torch.quantile(torch.randn(8, 16, device="cuda"), 0.5, dim=1).shape == (8,)
