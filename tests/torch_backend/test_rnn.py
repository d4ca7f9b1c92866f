"""Recurrent layers run as cuDNN does: one fused kernel per pass, reserve space held until backward, packed input."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.torch_backend.listeners import KernelLog

import gpemu.torch_backend as gt
from gpemu.hardware import get_gpu
from gpemu.torch_backend.rnn import RnnShape, pass_seconds


def test_lstm_training_step_is_one_kernel_per_pass(emu: gt.Emulation) -> None:
    names = KernelLog()
    emu.devices[0].add_listener(names)
    lstm = torch.nn.LSTM(16, 8, num_layers=2).cuda()
    x = torch.randn(5, 3, 16, device="cuda")
    out, (h, c) = lstm(x)
    assert out.shape == (5, 3, 8) and h.shape == c.shape == (2, 3, 8) and out.device.type == "cuda"
    out.sum().backward()
    rnn_items = [(n, d) for n, d in names.items if n.startswith("cudnn_rnn")]
    assert [n for n, _ in rnn_items] == ["cudnn_rnn_lstm", "cudnn_rnn_lstm_backward"]  # not ~100 per-step ops
    shape = RnnShape("lstm", 5, 3, 16, 8, 2, 1, False, torch.float32)
    assert rnn_items[0][1] == pytest.approx(pass_seconds(shape, get_gpu("v100"), backward=False))
    assert {tuple(p.grad.shape) for p in lstm.parameters()} == {(32, 16), (32, 8), (32,)}  # 4 gates x 8 hidden


def test_gru_batch_first_bidirectional_shapes(emu: gt.Emulation) -> None:
    gru = torch.nn.GRU(16, 8, batch_first=True, bidirectional=True).cuda()
    out, h = gru(torch.randn(3, 5, 16, device="cuda", requires_grad=True))
    assert out.shape == (3, 5, 16) and h.shape == (2, 3, 8)  # 2 directions x 8 hidden
    out.mean().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in gru.parameters())


def test_reserve_space_is_held_from_forward_to_backward(emu: gt.Emulation) -> None:
    lstm = torch.nn.LSTM(16, 8).cuda()
    x = torch.randn(5, 3, 16, device="cuda")
    alloc = torch.cuda.memory_allocated
    base = alloc()
    with torch.no_grad():
        out, (h, c) = lstm(x)
    inference = alloc() - base
    del out, h, c
    base = alloc()
    out, (h, c) = lstm(x)
    training = alloc() - base
    # reserve = T*B*(G+2)*H*4 bytes = 5*3*(4+2)*8*4 = 2880, rounded up to the allocator's 512-byte blocks: 3072
    assert training - inference == 3072
    out.sum().backward()
    del out, h, c
    # the reserve went with the graph; the parameter grads stay: w_ih 32x16x4 = 2048, w_hh 32x8x4 = 1024, and two
    # 32x4 = 128-byte biases rounded to 512 each: 2048 + 1024 + 512 + 512 = 4096
    assert alloc() - base == 4096


def test_longer_sequences_cost_proportionally_more() -> None:
    spec = get_gpu("a100")
    short = RnnShape("lstm", 35, 20, 200, 200, 2, 1, False, torch.float32)
    long = RnnShape("lstm", 70, 20, 200, 200, 2, 1, False, torch.float32)
    ratio = pass_seconds(long, spec, False) / pass_seconds(short, spec, False)
    # per-step recurrent GEMMs and gate kernels double exactly; the one input GEMM per layer less than doubles on the
    # efficiency ramp: so the ratio is just under 2
    assert 1.8 < ratio <= 2.0
    assert pass_seconds(short, spec, True) > pass_seconds(short, spec, False)  # backward adds three GEMMs per layer


def test_packed_sequence_round_trip(emu: gt.Emulation) -> None:
    lstm = torch.nn.LSTM(16, 8).cuda()
    x = torch.randn(5, 3, 16, device="cuda", requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 4, 2]))
    assert packed.batch_sizes.tolist() == [3, 3, 2, 2, 1]  # steps 0-1: 3 sequences, 2-3: 2, 4: 1
    assert packed.data.shape == (11, 16)  # 5 + 4 + 2 rows
    out, (h, _c) = lstm(packed)
    padded, lengths = torch.nn.utils.rnn.pad_packed_sequence(out)
    assert padded.shape == (5, 3, 8) and lengths.tolist() == [5, 4, 2] and h.shape == (1, 3, 8)
    padded.sum().backward()
    assert x.grad is not None and x.grad.shape == (5, 3, 16)


def test_unsorted_lengths_are_sorted_by_torch(emu: gt.Emulation) -> None:
    x = torch.randn(3, 4, 2, device="cuda")  # batch_first: 3 sequences of up to 4 steps
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, [2, 4, 3], batch_first=True, enforce_sorted=False)
    assert packed.batch_sizes.tolist() == [3, 3, 2, 1]
    # the sort ran on the host (lengths are host values), so its permutation round-trips to the host intact
    assert packed.sorted_indices.tolist() == [1, 2, 0] and packed.unsorted_indices.tolist() == [2, 0, 1]
    padded, lengths = torch.nn.utils.rnn.pad_packed_sequence(packed, batch_first=True)
    assert padded.shape == (3, 4, 2) and lengths.tolist() == [2, 4, 3]  # original order restored


def _step_items(emu: gt.Emulation, run: Any) -> list[str]:
    names = KernelLog()
    emu.devices[0].add_listener(names)
    run()
    return [n for n, _ in names.items]


def test_lstm_cell_step_runs_the_fused_cuda_kernels(emu: gt.Emulation) -> None:
    # See Note [Fused RNN cells]: CUDA's LSTMCell is two GEMMs and one fused gate kernel forward; backward is the
    # fused gate backward (which also sums the bias gradient) plus the GEMMs' gradients
    cell = torch.nn.LSTMCell(3, 5).cuda()
    x = torch.randn(4, 3, device="cuda")
    h = torch.zeros(4, 5, device="cuda")
    c = torch.zeros(4, 5, device="cuda")
    out: dict[str, Any] = {}

    def forward() -> None:
        out["h"], out["c"] = cell(x, (h, c))

    fwd = _step_items(emu, forward)
    assert fwd == ["mm.default", "mm.default", "_thnn_fused_lstm_cell.default"]  # not ~12 decomposed ops
    assert out["h"].shape == out["c"].shape == (4, 5) and out["h"].device.type == "cuda"
    bwd = _step_items(emu, lambda: (out["h"].sum() + out["c"].sum()).backward())
    assert "_thnn_fused_lstm_cell_backward_impl.default" in bwd and "sigmoid_backward.default" not in bwd
    assert {tuple(p.grad.shape) for p in cell.parameters()} == {(20, 3), (20, 5), (20,)}  # 4 gates x 5 hidden


def test_gru_cell_step_runs_the_fused_cuda_kernels(emu: gt.Emulation) -> None:
    cell = torch.nn.GRUCell(3, 5, bias=True).cuda().double()
    x = torch.randn(4, 3, device="cuda", dtype=torch.float64, requires_grad=True)
    h = torch.zeros(4, 5, device="cuda", dtype=torch.float64)
    out: dict[str, Any] = {}

    def forward() -> None:
        out["h"] = cell(x, h)

    assert _step_items(emu, forward) == ["mm.default", "mm.default", "_thnn_fused_gru_cell.default"]
    assert out["h"].shape == (4, 5) and out["h"].dtype == torch.float64
    bwd = _step_items(emu, lambda: out["h"].sum().backward())
    assert "_thnn_fused_gru_cell_backward.default" in bwd
    assert x.grad is not None and x.grad.shape == (4, 3)
    assert {tuple(p.grad.shape) for p in cell.parameters()} == {(15, 3), (15, 5), (15,)}  # 3 gates x 5 hidden
    # an unbatched input (LSTMCell/GRUCell unsqueeze it before _VF) and a cell without biases
    plain = torch.nn.GRUCell(3, 5, bias=False).cuda()
    assert plain(torch.randn(3, device="cuda")).shape == (5,)


def test_cpu_cells_keep_torchs_path(emu: gt.Emulation) -> None:
    cell = torch.nn.LSTMCell(3, 5)
    h, c = cell(torch.ones(2, 3))
    assert not isinstance(h, gt.EmuTensor) and torch.isfinite(h).all() and h.shape == c.shape == (2, 5)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_cells_without_bias_and_under_autocast(emu: gt.Emulation, cls: Any) -> None:
    # torch's meta kernel of _thnn_fused_lstm_cell read .device of the missing biases (bias=False failed)
    plain = cls(3, 8, bias=False).cuda()
    out = plain(torch.randn(4, 3, device="cuda"))
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    gates = 4 if cls is torch.nn.LSTMCell else 3
    assert [tuple(p.grad.shape) for p in plain.parameters()] == [(gates * 8, 3), (gates * 8, 8)]  # w_ih, w_hh
    # autocast casts a cell's inputs on a GPU: the fused cell runs in fp16 and its states come out fp16
    cell = cls(3, 8).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        out = cell(torch.randn(4, 3, device="cuda"))
    states = out if isinstance(out, tuple) else (out,)
    assert all(s.dtype == torch.float16 for s in states)
    sum(s.float().sum() for s in states).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in cell.parameters())
