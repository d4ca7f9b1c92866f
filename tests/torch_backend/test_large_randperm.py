"""Note [Large device permutations]: a device randperm keeps its host-drawn value only up to a size cap."""

from __future__ import annotations

import time

import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import patches


def test_a_small_permutation_is_drawn_and_a_large_one_only_ranged() -> None:
    gt.install("a100")
    try:
        small = torch.randperm(10, device="cuda")
        assert sorted(small.tolist()) == list(range(10))  # drawn on the host: a real permutation of 0..9
        n = patches.RANDPERM_KNOWN_MAX + 1  # 8,388,609 elements: 67 MB of int64 were drawn and kept before
        t0 = time.perf_counter()
        big = torch.randperm(n, device="cuda")
        drawn_s = time.perf_counter() - t0
        assert big.shape == (n,) and big.is_cuda
        assert int(big.max()) == n - 1  # the range's end (Note [Value ranges]): not a read of 0
        rays = torch.empty(n, 3, device="cuda")
        assert rays[big[:1024]].shape == (1024, 3)  # indexing with it stays shape-only
        assert drawn_s < 0.05  # no host draw of 8.4 M elements (~0.1-0.3 s on this host when drawn)
    finally:
        gt.uninstall()
