"""Small counters on the device keep their host value through in-place updates, module moves and deep copies."""

from __future__ import annotations

import copy

import torch
from torch import nn

import gpemu.torch_backend as gt


def test_batchnorm_cumulative_average_counts_batches(emu: gt.Emulation) -> None:
    bn = nn.BatchNorm2d(4, momentum=None).cuda()  # the buffer moved by Module.cuda() keeps its value 0
    for _ in range(3):
        bn(torch.randn(2, 4, 3, 3, device="cuda"))  # 1.0 / float(num_batches_tracked) divided by zero before
    assert bn.num_batches_tracked.item() == 3


def test_scalar_inplace_arithmetic_and_resets(emu: gt.Emulation) -> None:
    c = torch.tensor(5, device="cuda")
    c += 2
    c.mul_(3)
    assert c.item() == 21  # (5 + 2) * 3
    c.zero_()
    c.add_(1)
    assert c.item() == 1
    computed = torch.randn(4, device="cuda").sum()  # a computed value stays unknown: reads 0
    computed.add_(1)
    assert computed.item() == 0.0


def test_deepcopy_and_update_bn(emu: gt.Emulation) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).cuda()
    model(torch.randn(2, 3, 8, 8, device="cuda"))
    assert copy.deepcopy(model)[1].num_batches_tracked.item() == 1
    swa_model = torch.optim.swa_utils.AveragedModel(model)
    swa_model.update_parameters(model)
    loader = [torch.randn(2, 3, 8, 8) for _ in range(2)]
    torch.optim.swa_utils.update_bn(loader, swa_model, device=torch.device("cuda"))  # momentum=None inside
    assert swa_model.module[1].num_batches_tracked.item() == 2  # reset, then one per batch
    assert swa_model.n_averaged.item() == 1


def test_reductions_of_host_known_labels(emu: gt.Emulation) -> None:
    labels = torch.tensor([0, 3, 6, 2]).to("cuda")  # copied from the host: values known
    assert labels.max().item() + 1 == 7  # the num_classes idiom (pytorch/examples gcn); it read 0 + 1 before
    assert int(labels.sum()) == 11 and labels.min().item() == 0
    assert torch.bincount(labels).shape == (7,)  # max + 1 bins, as on a GPU
    assert torch.randn(3, device="cuda").max().item() == 0.0  # computed values stay unknown


def test_many_updates_between_reads(emu: gt.Emulation) -> None:
    step = torch.tensor(0).to("cuda")
    for _ in range(150):  # queued on the host value and applied in batches of 64 and on read
        step.add_(1)
    assert step.item() == 150
    step.mul_(2).sub_(100)
    assert step.item() == 200  # 150 * 2 - 100


def test_casts_of_host_known_values(emu: gt.Emulation) -> None:
    labels = torch.tensor([0, 1, 2, 3]).cuda()
    assert labels.float().tolist() == [0.0, 1.0, 2.0, 3.0]  # was zeros: the cast dropped the known value
    assert labels.to(torch.float16).sum().item() == 6.0
