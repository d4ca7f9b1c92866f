"""Recommendation-model idioms (facebookresearch/dlrm's dlrm_s_pytorch.py): embedding bags with sparse gradients
over large tables, SGD on those gradients, and the run report of a loop that tests every few steps."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.torch_backend.listeners import KernelLog

import gpemu.torch_backend as gt
from gpemu.cost import op_cost, op_time_s
from gpemu.errors import UnsupportedOpError
from gpemu.hardware import get_gpu
from gpemu.report.summary import _emulator_warmup

# torch's own warning when a script (SparseAdam, `grad.new(...)`) builds a sparse tensor: a GPU run prints it too
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
aten = torch.ops.aten
ROWS, DIM, BAGS, PER_BAG = 1_000_000, 16, 128, 10
NNZ = BAGS * PER_BAG  # 1,280 lookups


def _bag(emu: gt.Emulation) -> tuple[torch.nn.EmbeddingBag, torch.Tensor, torch.Tensor, KernelLog]:
    """DLRM's table: `nn.EmbeddingBag(n, m, mode="sum", sparse=True)`, 128 bags of 10 indices each."""
    emb = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True).cuda()
    idx = torch.randint(0, ROWS, (NNZ,)).cuda()
    off = torch.arange(0, NNZ, PER_BAG).cuda()
    kernels = KernelLog()
    emu.devices[0].add_listener(kernels)
    return emb, idx, off, kernels


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_embedding_bag_gives_a_sparse_gradient_of_its_lookups(emu: gt.Emulation) -> None:
    # Note [Sparse tensors]: the backward returned a sparse tensor straight from `_embedding_bag_backward`, and the
    # op cache died reading its storage ("Cannot access storage of SparseTensorImpl")
    emb, idx, off, kernels = _bag(emu)
    before = torch.cuda.memory_allocated()
    out = emb(idx, off)
    out.sum().backward()
    del out
    g = emb.weight.grad
    assert g.is_sparse and g.layout == torch.sparse_coo and g.device == torch.device("cuda", 0)
    assert tuple(g.shape) == (ROWS, DIM) and g._nnz() == NNZ and not g.is_coalesced()  # as on a GPU (and the CPU)
    assert tuple(g._indices().shape) == (1, NNZ) and tuple(g._values().shape) == (NNZ, DIM)
    # AccumulateGrad keeps a clone: indices 1,280 x 8 B = 10,240 + values 1,280 x 16 x 4 B = 81,920 -> 92,160 B;
    # a dense gradient would be 1M x 16 x 4 B = 64 MB
    assert torch.cuda.memory_allocated() - before == 92_160
    # the backward is one gather of the output gradient's rows by offset2bag, [128, 16] -> [1280, 16]
    bwd = [(n, s) for n, s in kernels.items if n == "index_select"]
    assert len(bwd) == 1
    expected = op_time_s(aten.index_select.default, (_meta(BAGS, DIM), 0, _meta(NNZ, dtype=torch.long)), {},
                         _meta(NNZ, DIM), get_gpu("v100"))
    assert bwd[0][1] == pytest.approx(expected)
    del g
    emb.weight.grad = None
    assert torch.cuda.memory_allocated() == before


def test_sgd_on_a_sparse_gradient_adds_the_rows_only(emu: gt.Emulation) -> None:
    # `param.add_(grad, alpha=-lr)` on a GPU, for an uncoalesced gradient: values.mul(-lr), then index_add_ of the
    # 1,280 rows into the table (add_out_dense_sparse_cuda); never a pass over the 64 MB table
    emb, idx, off, kernels = _bag(emu)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    emb(idx, off).sum().backward()
    kernels.items.clear()
    opt.step()
    assert [n for n, _ in kernels.items] == ["mul", "index_add_"]
    v100 = get_gpu("v100")
    # index_add_ reads the 81,920 B of values and the 10,240 B index and read-modify-writes 81,920 B of rows:
    # 3 x 81,920 + 10,240 = 256,000 B (the registry's rule; Note [Embedding bags and scatter-adds])
    rows = _meta(NNZ, DIM)
    assert op_cost(aten.index_add_.default, (rows, 0, _meta(NNZ, dtype=torch.long), _meta(NNZ, DIM)), {},
                   rows).bytes == 256_000
    table = _meta(ROWS, DIM)
    dense_s = op_time_s(aten.add_.Tensor, (table, table), {}, table, v100)  # a dense update: 3 x 64 MB
    assert kernels.items[1][1] < dense_s / 10
    opt.zero_grad()
    assert emb.weight.grad is None


def test_embedding_bag_forward_reads_the_gathered_rows_not_the_table() -> None:
    # `_embedding_bag` fell through to the by-name rule: every argument read, the whole 64 MB table per call
    weight, idx, off = _meta(ROWS, DIM), _meta(NNZ, dtype=torch.long), _meta(BAGS, dtype=torch.long)
    out = aten._embedding_bag.default(weight, idx, off, False, 0, True)
    cost = op_cost(aten._embedding_bag.default, (weight, idx, off, False, 0, True), {}, out)
    # gathered rows 1,280 x 16 x 4 = 81,920 + indices 10,240 + offsets 1,024 + outputs: pooled 128 x 16 x 4 = 8,192,
    # offset2bag 10,240, bag sizes 1,024, max indices (empty for sum) 0 -> 112,640 B
    assert cost.bytes == 112_640 and cost.category == "embedding" and cost.flops == NNZ * DIM


def test_index_add_prices_the_rows_it_touches() -> None:
    target, index, source = _meta(ROWS, DIM), _meta(NNZ, dtype=torch.long), _meta(NNZ, DIM)
    in_place = op_cost(aten.index_add_.default, (target, 0, index, source), {}, target)
    assert in_place.bytes == 3 * 81_920 + 10_240  # source read, rows read and written, index read
    copy = op_cost(aten.index_add.default, (target, 0, index, source), {}, _meta(ROWS, DIM))
    assert copy.bytes == in_place.bytes + 2 * ROWS * DIM * 4  # out of place: `self` copied first


def test_gradients_accumulate_and_zero_without_set_to_none(emu: gt.Emulation) -> None:
    emb, idx, off, kernels = _bag(emu)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    emb(idx, off).sum().backward()
    kernels.items.clear()
    emb(idx, off).sum().backward()  # sparse + sparse: indices and values concatenated, uncoalesced
    g = emb.weight.grad
    assert g._nnz() == 2 * NNZ and tuple(g._values().shape) == (2 * NNZ, DIM)
    assert [n for n, _ in kernels.items if n == "cat"] == ["cat", "cat"]
    held = torch.cuda.memory_allocated()
    opt.zero_grad(set_to_none=False)  # zero_ on a sparse tensor: nnz 0, no kernel
    assert emb.weight.grad is g and g._nnz() == 0
    # its 2,560-entry parts are freed: indices 2,560 x 8 = 20,480 + values 2,560 x 64 = 163,840 -> 184,320 B
    assert held - torch.cuda.memory_allocated() == 184_320


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),  # sparse momentum buffers: foreach ops per tensor
    lambda ps: torch.optim.SparseAdam(list(ps), lr=0.01),  # coalesce, sparse_mask, `grad.new`-free
    lambda ps: torch.optim.Adagrad(ps, lr=0.01),
])
def test_sparse_optimizers_step(emu: gt.Emulation, make: Any) -> None:
    emb, idx, off, kernels = _bag(emu)
    opt = make(emb.parameters())
    for _ in range(2):
        emb(idx, off).sum().backward()
        opt.step()
        opt.zero_grad()
    # after the optimizer state exists, no kernel of the second step streams the 64 MB table: each is nnz-sized
    # (a dense pass over the table on a V100 is ~0.14 ms: 128 MB at ~900 GB/s)
    kernels.items.clear()
    emb(idx, off).sum().backward()
    opt.step()
    assert kernels.items and max(s for _, s in kernels.items) < 50e-6


def test_coalesce_keeps_nnz_and_legacy_new_builds_on_the_device(emu: gt.Emulation) -> None:
    emb, idx, off, _ = _bag(emu)
    emb(idx, off).sum().backward()
    g = emb.weight.grad
    c = g.coalesce()  # no meta kernel: nnz kept (every index distinct), marked coalesced
    assert c.is_coalesced() and c._nnz() == NNZ and c.device.type == "cuda"
    # row-wise Adagrad's `grad.new(indices, values, size)`: torch's binding refused a SparseMeta type
    s = g.new(c._indices(), c._values(), g.size())
    assert s.is_sparse and s.device == torch.device("cuda", 0) and s._nnz() == NNZ
    dense = torch.zeros(3, device="cuda")
    assert dense.new(2, 5).device == torch.device("cuda", 0)  # was a plain meta tensor
    data = dense.new([1.0, 2.0])
    assert data.device == torch.device("cuda", 0) and tuple(data.shape) == (2,)


def test_unemulated_sparse_op_names_itself(emu: gt.Emulation) -> None:
    emb, idx, off, _ = _bag(emu)
    emb(idx, off).sum().backward()
    with pytest.raises(UnsupportedOpError, match=r"aten\.sum.*sparse tensor.*sparse=False"):
        emb.weight.grad.sum()


def test_models_with_sparse_embeddings_never_replay(emu: gt.Emulation) -> None:
    # the replay path gives every parameter a dense gradient; the optimizer replay keys gradients by shape, not nnz
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(1000, 8, mode="sum", sparse=True)
            self.top = torch.nn.Linear(8, 1)

        def forward(self, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
            return self.top(self.emb(i, o))

    model = Tiny().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    i, o = torch.randint(0, 1000, (40,)).cuda(), torch.arange(0, 40, 4).cuda()
    for _ in range(4):  # fixed shapes: a dense model would record twice, then replay
        model(i, o).sum().backward()
        opt.step()
        opt.zero_grad()
    assert emu.replay is not None and emu.replay.replayed == 0
    assert model.emb.weight.grad is None


def test_emulator_warmup_compares_training_rows_with_training_rows() -> None:
    # dlrm with --test-freq: 40 training steps of 184 ops and 80 test batches of 42: the first three training steps
    # were skipped as "per-op recording before replay" (184 > 2 x median 42) in a run that never replayed
    def rows(train_ops: list[int]) -> list[dict[str, Any]]:
        out = [{"emulator_ops": n, "train": True} for n in train_ops[:20]] + [{"emulator_ops": 42, "train": False}] * 40
        return out + [{"emulator_ops": n, "train": True} for n in train_ops[20:]] + [{"emulator_ops": 42,
                                                                                      "train": False}] * 40

    assert _emulator_warmup(rows([184] * 40), warmup=1) == 0
    # a model that replays still has its recording steps skipped: 3 per-op steps of 184 ops, then 12-op replays
    assert _emulator_warmup(rows([184] * 4 + [12] * 36), warmup=1) == 3
