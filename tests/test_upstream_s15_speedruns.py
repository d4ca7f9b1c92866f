"""Idioms of the CIFAR-10 / GPT speed-run scripts of session 15 (KellerJordan's airbench, tysam-code's hlb-CIFAR10,
modded-nanogpt) under the drop-in emulation."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt


def test_cov_of_an_emulated_tensor() -> None:
    # Note [Equal on internal meta tensors]: hlb-CIFAR10 whitens its first convolution from the covariance of 2x2
    # patches: torch.cov(patches.view(n, 12).t()). cov's C++ builds `num_observations` with `scalar_tensor(n,
    # observations.options())` -- a plain meta tensor under emulation -- and warns if `is_scalar_tensor_true(
    # le(norm_factor, 0))`, i.e. `equal(t, t.new_ones({}))` on meta, which had no kernel: NotImplementedError.
    gt.install("a100")
    try:
        patches = torch.randn(5000, 3, 2, 2, device="cuda")  # 5,000 patches of 3 x 2 x 2 = 12 values
        cov = torch.cov(patches.view(5000, 12).t())
        # (12 variables x 5000 observations) -> a 12 x 12 covariance, float32, still on the emulated device
        assert tuple(cov.shape) == (12, 12)
        assert cov.dtype == torch.float32 and str(cov.device) == "cuda:0"
        eigenvalues, eigenvectors = torch.linalg.eigh(cov, UPLO="U")  # the whitening step that follows
        assert tuple(eigenvalues.shape) == (12,) and tuple(eigenvectors.shape) == (12, 12)
        torch.cuda.synchronize()
        # the Meta kernel answers as gpemu's `equal` does for values it does not know: a 0-dim bool check reads
        # False (the check does not fire), other tensors read equal exactly when their shapes match
        flag = torch.empty((), dtype=torch.bool, device="meta")
        assert torch.equal(flag, flag.new_ones(())) is False
        assert torch.equal(torch.empty(3, device="meta"), torch.empty(3, device="meta")) is True
        assert torch.equal(torch.empty(3, device="meta"), torch.empty(4, device="meta")) is False
    finally:
        gt.uninstall()
    # uninstalling removes the kernel: plain meta tensors are torch's own again
    with pytest.raises(NotImplementedError):
        torch.equal(torch.empty(3, device="meta"), torch.empty(3, device="meta"))
