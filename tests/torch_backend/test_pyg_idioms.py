"""PyTorch Geometric idioms (examples/proteins_topk_pool.py, gcn.py, link_pred.py): outputs sized by an index's largest
value (`int(index.max()) + 1`) after selections, large edge indices copied from the host, and the replay path."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import ops

GRAPHS, NODES = 60, 39  # a PROTEINS batch: 60 graphs of 39 nodes -> 2,340 nodes


def _batch_vector(graphs: int = GRAPHS, nodes: int = NODES) -> torch.Tensor:
    """PyG's `data.batch` copied to the device: graph g's nodes carry g (2,340 x 8 B = 18.7 KB: a known value)."""
    return torch.arange(graphs).repeat_interleave(nodes).cuda()


def _computed_perm(n: int) -> torch.Tensor:
    """A node permutation computed on the device (TopK's `score.sort(descending=True)`): its values are not known."""
    return torch.randn(n, device="cuda").sort(descending=True)[1]


def test_a_selection_of_the_batch_vector_reads_its_graph_count(emu: gt.Emulation) -> None:
    # Note [Value ranges]: PyG's TopKPooling returns `arange(k).scatter_(0, arange(k), batch[perm])` and global pooling
    # sizes its output by `int(batch.max()) + 1`; the pooled batch read 0 -> one pooled row where the batch had 60, and
    # proteins_topk_pool.py died in nll_loss ("Expected input batch_size (1) to match target batch_size (60)")
    batch = _batch_vector()
    k = batch.numel()
    perm = _computed_perm(k)
    assert ops.value_range(perm) == (0, k - 1)  # sort's indices along a dim of 2,340
    pooled = torch.arange(k, device="cuda").scatter_(0, torch.arange(k, device="cuda"), batch[perm])
    assert int(pooled.max()) + 1 == GRAPHS and int(pooled.min()) == 0
    # PyG's scatter(x, pooled, reduce="max") with dim_size=None: 60 rows, not 1
    x = torch.randn(k, 128, device="cuda")
    rows = int(pooled.max()) + 1
    out = x.new_zeros((rows, 128)).scatter_reduce_(0, pooled.view(-1, 1).expand_as(x), x, "amax", include_self=False)
    assert out.shape == (GRAPHS, 128)


def test_a_partial_scatter_keeps_the_old_values_in_range(emu: gt.Emulation) -> None:
    # arange(2,340) overwritten at 10 positions only: the old values 0..2,339 stay possible, so the max reads 2,339
    base = torch.arange(2340, device="cuda")
    base.scatter_(0, torch.arange(10, device="cuda"), torch.zeros(10, dtype=torch.long, device="cuda"))
    assert int(base.max()) == 2339


def test_a_large_edge_index_reads_its_node_count_and_forgets_it_when_changed(emu: gt.Emulation) -> None:
    # Cora's edge_index: 2 x 10,556 int64 = 168,896 B, over the 64 KiB a copy keeps as a known value. PyG's
    # `maybe_num_nodes(edge_index)` is `int(edge_index.max()) + 1`: 2,708 (it read 1 before)
    edge_index = torch.randint(0, 2708, (2, 10556))
    edge_index[0, 0] = 2707
    edge_index[1, 0] = 0
    dev = edge_index.cuda()
    assert ops.known_value(dev) is None and ops.value_range(dev) == (0, 2707)
    assert int(dev.max()) + 1 == 2708 and int(dev[1].max()) == int(edge_index[1].max())  # a view: its base's range
    kept = dev[:, dev[0] != dev[1]]  # add_remaining_self_loops' mask: computed, every edge kept (worst case)
    loops = torch.arange(2708, device="cuda").view(1, -1).repeat(2, 1)
    both = torch.cat([kept, loops], dim=1)
    assert int(both.max()) + 1 == 2708
    dev.add_(1)  # an in-place op that computes new values: the range is forgotten and the read is the default 0
    assert int(dev.max()) == 0


def test_filtered_edges_read_the_pooled_node_count(emu: gt.Emulation) -> None:
    # PyG's filter_adj: `mask = perm.new_full((n,), -1); mask[perm] = arange(k); row, col = mask[row], mask[col]`,
    # then `stack`: the new edge_index holds -1 .. k-1
    n, k = 2340, 1872  # ceil(0.8 * 2,340)
    perm = _computed_perm(n)[:k]
    mask = perm.new_full((n,), -1)
    mask[perm] = torch.arange(k, device="cuda")
    row = mask[torch.randint(0, n, (5000,), device="cuda")]
    edge_index = torch.stack([row, row], dim=0)
    assert ops.value_range(edge_index) == (-1, k - 1) and int(edge_index.max()) + 1 == k


class _Pool(torch.nn.Module):
    """A TopKPooling-like module: projects, sorts nodes by score, keeps them, returns the permuted batch vector."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        perm = self.lin(x).view(-1).sort(descending=True)[1]
        return x[perm], batch[perm]


class _Readout(torch.nn.Module):
    """A head that reads its batch's graph count inside forward (global add pooling with dim_size=None)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        rows = int(batch.max()) + 1
        return self.lin(x.new_zeros((rows, x.shape[1])).index_add_(0, batch, x))


def test_replayed_forwards_keep_their_output_ranges(emu: gt.Emulation) -> None:
    # Note [Ranges through replay]: a replayed _Pool runs none of its ops; before, its permuted batch lost its range
    # and the global pooling after it read 0 -> 1 row
    pool = _Pool().cuda().eval()
    x = torch.randn(GRAPHS * NODES, 16, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            _, b = pool(x, _batch_vector()[_computed_perm(GRAPHS * NODES)])  # the batch itself computed each call
            assert int(b.max()) + 1 == GRAPHS
    assert emu.replay is not None and emu.replay.replayed >= 2


def test_a_forward_that_reads_a_range_is_keyed_by_its_inputs_ranges(emu: gt.Emulation) -> None:
    # 60 graphs of 39 nodes and 30 graphs of 78 nodes: both 2,340 nodes, same shapes; the replay of the first must
    # not answer the second (its readout has 30 rows)
    readout = _Readout().cuda().eval()
    x = torch.randn(2340, 16, device="cuda")
    with torch.no_grad():
        for graphs, nodes in ((60, 39), (60, 39), (60, 39), (30, 78), (30, 78), (30, 78), (60, 39)):
            batch = _batch_vector(graphs, nodes)[_computed_perm(2340)]  # computed: only its range is known
            assert readout(x, batch).shape == (graphs, 16)
    assert emu.replay is not None and emu.replay.replayed >= 2


def test_arange_beyond_the_known_size_has_its_range(emu: gt.Emulation) -> None:
    a = torch.arange(3, 60003, 2, device="cuda")  # 30,000 x 8 B = 240 KB: no known value, a range
    assert ops.known_value(a) is None and ops.value_range(a) == (3, 60001)


def test_pyg_topk_pooling_and_global_pools_size_by_graphs(emu: gt.Emulation) -> None:
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GraphConv, TopKPooling, global_max_pool, global_mean_pool

    conv, pool = GraphConv(3, 128).cuda(), TopKPooling(128, ratio=0.8).cuda()
    batch = _batch_vector()
    edge_index = torch.randint(0, NODES, (2, 4000)) + torch.arange(GRAPHS).repeat_interleave(67)[:4000] * NODES
    x = torch.randn(GRAPHS * NODES, 3, device="cuda")
    for _ in range(4):  # the later calls replay TopKPooling
        h = conv(x, edge_index.cuda()).relu()
        h, ei, _, b, _, _ = pool(h, edge_index.cuda(), None, batch)
        out = torch.cat([global_max_pool(h, b), global_mean_pool(h, b)], dim=1)
        assert out.shape == (GRAPHS, 256)
        assert int(ei.max()) < h.shape[0]  # filtered edges index the kept nodes (-1 .. k-1 as filter_adj maps them)
        out.sum().backward()
    assert emu.replay is not None and emu.replay.replayed >= 2
