"""Output strides of the fast shape functions (Note [Output strides of fast shape functions] in shapes.py)."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpemu.torch_backend as gt


@pytest.fixture
def emu():
    e = gt.install("a100", replay=False)
    yield e
    gt.uninstall()


@pytest.mark.parametrize("op", [lambda t: t * 2, lambda t: t.clone(), torch.nn.functional.gelu,
                                lambda t: t.to(torch.float16)])
def test_an_op_on_a_slice_gives_a_dense_output(emu, op) -> None:
    # a GPU's TensorIterator / empty_like allocate a dense output: (10, 1) for a (4, 10) slice of a (4, 20) tensor,
    # so `.view(-1)` works. The emulated output kept the slice's (20, 1) strides and `.view(-1)` raised
    s = torch.randn(4, 20, device="cuda")[:, :10]
    y = op(s)
    assert y.stride() == (10, 1) and y.view(-1).shape == (40,)
    # a channels_last tensor's slice stays channels_last, dense: (N, C, H, W) = (2, 8, 3, 6) -> (144, 1, 48, 8), as
    # torch gives on the CPU
    c = torch.randn(2, 8, 6, 6, device="cuda").to(memory_format=torch.channels_last)[:, :, :3]
    assert op(c).stride() == (144, 1, 48, 8)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count[str(func)] += 1
        return func(*args, **(kwargs or {}))


def test_layer_norm_on_a_permuted_view_is_contiguous_and_the_linear_after_it_is_one_addmm(emu) -> None:
    # ConvNeXt's block: x.permute(0, 2, 3, 1) -> LayerNorm -> nn.Linear. On a GPU layer_norm's output is contiguous
    # and F.linear folds the 4-d input into one addmm. The emulated output kept the permutation: the Linear ran as
    # clone + mm, and in a copy whose weights do not require grad (timm's ModelEma) as a bmm over the broadcast
    # weight, priced 26x the mm
    norm = torch.nn.LayerNorm(96).cuda()
    fc = torch.nn.Linear(96, 384).cuda()
    ema_fc = copy.deepcopy(fc)
    for p in ema_fc.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 96, 14, 14, device="cuda").permute(0, 2, 3, 1)
    y = norm(x)
    assert y.is_contiguous()
    for linear in (fc, ema_fc):
        with torch.no_grad(), _Ops() as ops:
            linear(y)
        assert ops.count["aten.addmm.default"] == 1
        assert not {"aten.bmm.default", "aten.mm.default", "aten.clone.default"} & set(ops.count)
    # and the backward's input gradient is contiguous too (CUDA's kernel makes it so; torch's meta kernel does not)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [96], norm.weight, norm.bias, 1e-5)
    grads = torch.ops.aten.native_layer_norm_backward(torch.ones_like(x), x, [96], mean, rstd, norm.weight, norm.bias,
                                                      [True, True, True])
    assert grads[0].is_contiguous()
