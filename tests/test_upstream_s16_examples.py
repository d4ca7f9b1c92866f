"""Session 16 upstream runs of pytorch/examples (dcgan, vae, siamese_network, mnist_forward_forward, mnist_rnn,
fast_neural_style, gcn, gat): the idioms that needed a fix, reproduced in a few lines of plain PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.torch_backend.listeners import KernelLog

import gpemu.torch_backend as gt
from gpemu.cost import op_time_s
from gpemu.hardware import get_gpu

# torch's own warning when a sparse COO tensor is built on the host: a GPU run prints it too
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _adjacency(n: int, per_row: int) -> torch.Tensor:
    """A coalesced n x n sparse COO matrix with `per_row` distinct entries in each of its first rows: entry i sits at
    row i // per_row, column 7919 * i mod n (distinct within a row since 7919 and n share no factor)."""
    nnz = n * per_row if per_row * n <= 1_000_000 else 1_000_000
    i = torch.arange(nnz)
    return torch.sparse_coo_tensor(torch.stack([i // per_row, (i * 7919) % n]), torch.ones(nnz), (n, n)).coalesce()


def test_sparse_matrix_moved_to_the_device_keeps_its_entries(emu_a100: gt.Emulation) -> None:
    # Note [Sparse matrices on the device]: pytorch/examples gcn moves `adj.to_sparse()` to cuda. The move gave a
    # sparse tensor with nnz 0 and no memory (torch's empty_like of a sparse tensor), then `torch.mm` raised an
    # UnsupportedOpError
    a = _adjacency(2708, 1)  # Cora's node count, 2,708 entries (one per row)
    assert a._nnz() == 2708 and a.is_coalesced()
    dev = emu_a100.devices[0]
    mem0, h2d0 = torch.cuda.memory_allocated(), dev.stats.h2d_bytes
    d = a.to("cuda")
    assert d.is_sparse and d.device == torch.device("cuda", 0) and tuple(d.shape) == (2708, 2708)
    assert d._nnz() == 2708 and d.is_coalesced()  # as the CPU tensor it came from (before: nnz 0)
    assert tuple(d._indices().shape) == (2, 2708) and tuple(d._values().shape) == (2708,)
    # two copies, indices 2 x 2,708 x 8 B = 43,328 and values 2,708 x 4 B = 10,832: 54,160 B, where the dense matrix
    # would be 2,708^2 x 4 B = 29.3 MB
    assert dev.stats.h2d_bytes - h2d0 == 54_160
    # each part rounded up to the allocator's 512 B: 43,520 + 11,264 = 54,784 B (before: 0)
    assert torch.cuda.memory_allocated() - mem0 == 54_784
    del d
    assert torch.cuda.memory_allocated() == mem0


def test_spmm_of_a_sparse_adjacency_is_priced_by_its_entries(emu_a100: gt.Emulation) -> None:
    # Note [Sparse matrices on the device]: mm of a sparse matrix by a dense one is cuSPARSE's SpMM, priced as a zeroed
    # result plus one gather of the nnz dense rows the entries read; the backward multiplies by `sparse.t()`
    n, k = 100_000, 64
    d = _adjacency(n, 10).to("cuda")  # 1,000,000 entries, 10 per row in the first 100,000 rows
    w = torch.zeros(n, k, device="cuda", requires_grad=True)
    log = KernelLog()
    emu_a100.devices[0].add_listener(log)
    out = torch.spmm(d, w)
    assert tuple(out.shape) == (n, k) and out.layout == torch.strided and out.device == torch.device("cuda", 0)
    assert [name for name, _ in log.items] == ["fill_", "spmm"]
    gpu = get_gpu("a100")
    fill = op_time_s(aten.fill_.Scalar, (_meta(n, k), 0), {}, _meta(n, k), gpu)
    gather = op_time_s(aten.index_select.default, (_meta(1_000_000, k), 0, _meta(1_000_000, dtype=torch.long)), {},
                       _meta(1_000_000, k), gpu)
    assert log.items[0][1] == pytest.approx(fill) and log.items[1][1] == pytest.approx(gather)
    # the gather reads and writes 1M x 64 fp32 rows (256 MB each) plus 8 MB of indices: 520 MB, 0.255 ms at the
    # A100's 2.04 TB/s peak, ~0.37 ms at the memory efficiency the cost model gives it
    assert 0.255e-3 < log.items[1][1] < 0.6e-3
    # a dense 100,000 x 100,000 x 64 fp32 GEMM (1.28 TFLOP, ~70 ms on an A100) is over 100x the sparse product
    dense = op_time_s(aten.mm.default, (_meta(n, n), _meta(n, k)), {}, _meta(n, k), gpu)
    assert dense > 100 * (log.items[0][1] + log.items[1][1])
    log.items.clear()
    out.sum().backward()  # grad of w = d.t() @ grad: t() clones indices and values, SpMM coalesces the result first
    names = [name for name, _ in log.items]
    assert names[-7:] == ["clone", "clone", "sort", "index_select", "clone", "fill_", "spmm"]
    assert w.grad is not None and tuple(w.grad.shape) == (n, k) and w.grad.device == torch.device("cuda", 0)


class _GraphConv(torch.nn.Module):
    """pytorch/examples gcn's GraphConv: `support = mm(x, W)`, `spmm(adj, support)`, x itself sparse in layer 1."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.kernel = torch.nn.Parameter(torch.empty(n_in, n_out))
        torch.nn.init.xavier_normal_(self.kernel)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.spmm(adj, torch.mm(x, self.kernel))


class _GCN(torch.nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.gc1, self.gc2 = _GraphConv(n_in, hidden), _GraphConv(hidden, n_out)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.gc2(F.dropout(F.relu(self.gc1(x, adj)), 0.5, self.training), adj), dim=1)


def test_gcn_with_sparse_features_and_adjacency_trains_per_op(emu_a100: gt.Emulation) -> None:
    # the gcn example's loop: sparse features (2,708 x 1,433, 49k entries in Cora) and adjacency moved to cuda,
    # Adam, NLL loss on index-selected rows, then two no-grad evaluations. A module with a sparse argument is never
    # recorded for replay (its recording keyed the arguments' storages, which a sparse tensor has not: "Cannot access
    # storage of SparseTensorImpl"); it runs per op, so every epoch charges the same kernels
    n, feats = 2708, 1433
    i = torch.arange(n * 18)  # 18 words per paper: 48,744 entries
    x = torch.sparse_coo_tensor(torch.stack([i // 18, (i * 7919) % feats]), torch.ones(n * 18), (n, feats))
    x = x.coalesce().to("cuda")
    adj = _adjacency(n, 5).to("cuda")
    labels = (torch.arange(n) % 7).cuda()
    idx_train = torch.randperm(n)[1500:].cuda()
    model = _GCN(feats, 16, 7).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    dev = emu_a100.devices[0]
    per_epoch = []
    for _ in range(3):
        log = KernelLog()
        remove = dev.add_listener(log)
        model.train()
        opt.zero_grad()
        out = model(x, adj)
        F.nll_loss(out[idx_train], labels[idx_train]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            assert tuple(model(x, adj).shape) == (n, 7)
        remove()
        per_epoch.append(log.items)
    assert model.gc1.kernel.grad is not None and tuple(model.gc1.kernel.grad.shape) == (feats, 16)
    assert per_epoch[1] == per_epoch[2]  # per op every epoch: the same kernels and times (no replay block)
    names = [name for name, _ in per_epoch[2]]
    assert not any(name.startswith("replay") for name in names)
    # SpMMs per epoch: 3 in the training forward (x @ W1, adj @ support1, adj @ support2), 3 in the backward (adj.t()
    # twice for the supports' gradients, x.t() for W1's), 3 in the evaluation forward
    assert names.count("spmm") == 9
