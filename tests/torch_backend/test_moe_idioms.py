"""Mixture-of-experts idioms (davidmrau/mixture-of-experts moe.py): top-k gates scattered into zeros, tokens
dispatched by `nonzero(gates)` and split by per-expert counts read on the host, outputs combined with index_add."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import ops

BATCH, EXPERTS, K, DIM = 5, 10, 4, 32  # moe.py's example.py: batch 5, 10 experts, top-4


def _gates() -> torch.Tensor:
    """Noisy top-k gating's gates: the top-k softmax of computed logits scattered into zeros (values unknown)."""
    logits = torch.randn(BATCH, DIM, device="cuda") @ torch.randn(DIM, EXPERTS, device="cuda")
    top_logits, top_indices = logits.topk(K + 1, dim=1)
    top_k_gates = torch.softmax(top_logits[:, :K], dim=1)
    return torch.zeros_like(logits).scatter(1, top_indices[:, :K], top_k_gates)


def test_scattered_gates_select_k_experts_per_token(emu: gt.Emulation) -> None:
    # Note [Nonzero bounds]: zeros hold 0 nonzeros; a scatter of a (5, 4) index writes at most 20 elements, and
    # `gates > 0` keeps that bound (zeros fail it): nonzero gives the 20 token-expert pairs a GPU routes, not all 50
    gates = _gates()
    assert ops.nonzero_bound(gates) == BATCH * K
    assert torch.nonzero(gates).shape == (20, 2)
    assert (gates > 0).nonzero().shape == (20, 2)
    assert ops.nonzero_bound(gates >= 0) is None  # zeros pass `>= 0`: no bound
    assert ops.nonzero_bound(gates > -1) is None
    # an in-place scatter of a one-hot value adds its index's 5 elements to the bound of 0
    one_hot = torch.zeros(BATCH, EXPERTS, device="cuda").scatter_(1, torch.zeros(BATCH, 1, dtype=torch.long,
                                                                                    device="cuda"), 1.0)
    assert ops.nonzero_bound(one_hot) == BATCH


def test_per_expert_counts_read_back_agree_with_nonzero(emu: gt.Emulation) -> None:
    # Note [Mask counts]: SparseDispatcher splits the 20 selected rows by `(gates > 0).sum(0).tolist()`; the counts read
    # [0] * 10 and split_with_sizes refused them ("expects split_sizes to sum exactly to 20"). 20 pairs over 10 experts
    # read 2 each; per token (sum(1)) 20 over 5 rows read 4 each = k
    gates = _gates()
    rows = torch.nonzero(gates)[:, 0]
    part_sizes = (gates > 0).sum(0).tolist()
    assert part_sizes == [2] * EXPERTS
    assert (gates > 0).sum(1).tolist() == [K] * BATCH
    assert (gates > 0).sum().item() == 20 and torch.count_nonzero(gates).item() == 20
    assert torch.count_nonzero(gates, dim=0).tolist() == [2] * EXPERTS
    parts = torch.split(torch.randn(BATCH, DIM, device="cuda")[rows], part_sizes, dim=0)
    assert [p.shape[0] for p in parts] == [2] * EXPERTS


def test_unbounded_mask_counts_follow_nonzero_fraction(emu: gt.Emulation) -> None:
    # a computed mask has no bound: nonzero assumes nonzero_fraction (1.0: all 50) and its counts sum to the same 50,
    # 5 per expert column (each at most the 5 rows it counts); 7 of 10 as 1/1/1/1/1/1/1/0/0/0 with fraction 0.7
    mask = torch.randn(BATCH, EXPERTS, device="cuda") > 0.5
    assert torch.nonzero(mask).shape[0] == 50
    assert mask.sum(0).tolist() == [5] * EXPERTS
    emu.nonzero_fraction = 0.7
    row = torch.randn(EXPERTS, device="cuda") > 0
    assert row.sum().item() == 7 == row.nonzero().shape[0]
    assert row.view(EXPERTS, 1).sum(1).tolist() == [1] * 7 + [0] * 3


def test_mask_counts_are_default_answers(emu: gt.Emulation) -> None:
    # the value hook answers first; host-known masks count their real elements; float sums are not counts
    known = torch.tensor([[True, False], [True, True]]).cuda()
    assert known.sum(0).tolist() == [2, 1]
    assert torch.randn(4, 3, device="cuda").sum(0).tolist() == [0.0] * 3
    gt.set_value_hook(lambda shape, dtype, reason: 3)
    try:
        assert (torch.randn(4, 3, device="cuda") > 0).sum(0).tolist() == [3] * 3
    finally:
        gt.set_value_hook(None)
