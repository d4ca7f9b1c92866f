"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) on the emulated GPU as cuDNN runs them: one fused kernel per pass.

Note [Fused RNN]: on a real GPU `nn.LSTM` calls `_VF.lstm`, which routes CUDA tensors to cuDNN: one call per forward
and one per backward for the whole sequence and every layer. Our wrapper tensors have a meta C++ device, so torch
would take its generic decomposition instead: per time step and layer a dozen small ops (a 2-layer LSTM over 35
steps is ~2,000 ops per training step), each with its own host dispatch and kernel. That is neither the GPU's
timeline nor its host cost. gpemu therefore intercepts `_VF.lstm / gru / rnn_tanh / rnn_relu` for emulated inputs
(unpacked sequences without LSTM projections; anything else keeps torch's path) and charges:
- forward, per layer and direction: one input GEMM over all steps [T*B, I] x [I, G*H] (cuDNN batches it), then T
  recurrent GEMMs [B, H] x [H, G*H] and T pointwise gate updates (G = 4 LSTM, 3 GRU, 1 RNN), each priced by the
  fitted cost model (`cost_time_s`; the small recurrent GEMMs sit on the efficiency ramp, which is why RNNs are
  latency-bound on big GPUs);
- backward: the same recurrent GEMMs and pointwise work, plus the input-gradient and both weight-gradient GEMMs;
- memory: outputs, final states and, when training, cuDNN's reserve space, estimated as T*B*(G+2)*H elements per
  layer and direction (gate activations plus h and c), held until backward. Directions are summed, not overlapped.
The charges go through the same path as any op (phase calibration, replay recording, trace). Packed sequences
(`pack_padded_sequence` / `pad_packed_sequence`) carry their batch sizes on the host, so packing and unpacking are
gathers of known size (priced as copies) and a packed RNN is priced as len(batch_sizes) steps at the largest batch.

Note [Fused RNN cells]: `nn.LSTMCell` / `nn.GRUCell` call `_VF.lstm_cell` / `_VF.gru_cell`, whose CUDA path (ATen's
LSTMCell/GRUCell for `input.is_cuda()`) is two GEMMs (`input @ w_ih.T`, `hx @ w_hh.T`) and one fused gate kernel
(`_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell`, biases added inside); backward is the fused gate backward (bias
gradients summed inside) plus the GEMMs' gradients. On our meta-backed tensors torch took the CPU decomposition
instead: addmm, split and five or more pointwise ops forward and about twice that backward, per cell and time step.
A cell loop (pytorch/examples time_sequence_prediction: 999 steps x 2 cells per forward) is then ~4x the ops a GPU
runs, each with its own host dispatch and launch. gpemu calls the CUDA composition for emulated inputs; the fused ops
are priced by the cost model's fallback (memory-bound elementwise on their bytes). Under autocast they run in the
autocast dtype (autocast casts lstm_cell/gru_cell's inputs on a GPU; gpemu's autocast list holds the fused ops, Note
[Autocast on meta] in autocast.py), so hy and cy come out 16-bit as on a GPU. CPU or mixed-device inputs keep torch's
own path.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpemu.cost.registry import OpCost
from gpemu.cost.roofline import cost_time_s
from gpemu.torch_backend import state
from gpemu.torch_backend.tensor import EmuTensor, charge

GATES: dict[str, int] = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
_DTYPE_KEYS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


@dataclass(frozen=True)
class RnnShape:
    """One recurrent call: sizes that fix its cost and outputs."""

    mode: str
    seq_len: int
    batch: int
    input_size: int
    hidden: int
    layers: int
    directions: int
    batch_first: bool
    dtype: torch.dtype
    tokens: int = 0  # packed input: sum of the batch sizes (rows of the packed data); 0 for padded input

    def output_shape(self) -> tuple[int, ...]:
        """Return the shape of the output sequence tensor (packed data rows or the padded layout)."""
        width = self.hidden * self.directions
        if self.tokens:
            return (self.tokens, width)
        return (self.batch, self.seq_len, width) if self.batch_first else (self.seq_len, self.batch, width)

    @property
    def gates(self) -> int:
        """Return the number of gate blocks (4 LSTM, 3 GRU, 1 plain RNN)."""
        return GATES[self.mode]

    def layer_input(self, layer: int) -> int:
        """Return the input width of `layer` (the previous layer's output for layer > 0)."""
        return self.input_size if layer == 0 else self.hidden * self.directions

    def reserve_bytes(self) -> int:
        """Return the estimated cuDNN reserve space of a training forward (see Note [Fused RNN])."""
        elems = self.seq_len * self.batch * (self.gates + 2) * self.hidden * self.layers * self.directions
        return elems * torch.empty((), dtype=self.dtype).element_size()


def _gemm(m: int, k: int, n: int, dtype: str, elem: int) -> OpCost:
    tensor_core = dtype in ("fp16", "bf16") and k % 8 == 0 and n % 8 == 0
    return OpCost(2.0 * m * k * n, float(elem * (m * k + k * n + m * n)), "matmul", dtype, tensor_core)


def pass_seconds(shape: RnnShape, spec: Any, backward: bool) -> float:
    """Return the predicted GPU seconds of one forward (or backward) pass over the whole sequence and all layers."""
    dtype = _DTYPE_KEYS.get(shape.dtype, "fp32")
    elem = torch.empty((), dtype=shape.dtype).element_size()
    gh = shape.gates * shape.hidden
    t, b, h = shape.seq_len, shape.batch, shape.hidden
    recurrent = cost_time_s(_gemm(b, h, gh, dtype, elem), "rnn_recurrent_gemm", spec)
    pointwise = cost_time_s(OpCost(10.0 * b * gh, float(elem * b * (gh + 4 * h)), "elementwise", dtype), "rnn_gates",
                            spec)
    total = 0.0
    for layer in range(shape.layers):
        inp = cost_time_s(_gemm(t * b, shape.layer_input(layer), gh, dtype, elem), "rnn_input_gemm", spec)
        per_direction = inp + t * (recurrent + pointwise)
        if backward:  # input-gradient GEMM (same size as the input GEMM) and the two weight-gradient GEMMs
            w_ih = cost_time_s(_gemm(gh, t * b, shape.layer_input(layer), dtype, elem), "rnn_wgrad_ih", spec)
            w_hh = cost_time_s(_gemm(gh, t * b, h, dtype, elem), "rnn_wgrad_hh", spec)
            per_direction += inp + w_ih + w_hh
        total += per_direction * shape.directions
    return total


class _FusedRNN(torch.autograd.Function):
    """One cuDNN RNN call: outputs with the right metadata, charged as one kernel per pass."""

    @staticmethod
    def forward(ctx: Any, shape: RnnShape, index: int, n_states: int, *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        emu = state.require()
        spec = emu.devices[index].spec
        device = torch.device("cuda", index)
        charge(index, f"cudnn_rnn_{shape.mode}", pass_seconds(shape, spec, backward=False))
        output = torch.empty(shape.output_shape(), dtype=shape.dtype, device=device)
        states = tuple(torch.empty((shape.layers * shape.directions, shape.batch, shape.hidden), dtype=shape.dtype,
                                   device=device) for _ in range(n_states))
        ctx.shape, ctx.index = shape, index
        ctx.meta = [(t.shape, t.dtype) for t in tensors]
        # training: cuDNN keeps a reserve space (gate activations) from forward to backward
        ctx.reserve = (torch.empty(shape.reserve_bytes(), dtype=torch.uint8, device=device)
                       if any(ctx.needs_input_grad) else None)
        return (output, *states)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        shape: RnnShape = ctx.shape
        index: int = ctx.index
        spec = state.require().devices[index].spec
        charge(index, f"cudnn_rnn_{shape.mode}_backward", pass_seconds(shape, spec, backward=True))
        device = torch.device("cuda", index)
        out = [torch.empty(s, dtype=d, device=device) if need else None
               for (s, d), need in zip(ctx.meta, ctx.needs_input_grad[3:], strict=True)]
        ctx.reserve = None
        return (None, None, None, *out)


def _emulated_call(mode: str, args: tuple[Any, ...]) -> Any:
    """Return the fused call's result, or NotImplemented when this call keeps torch's own path."""
    if len(args) != 9 or not isinstance(args[0], EmuTensor):
        return NotImplemented  # CPU inputs
    packed = not isinstance(args[3], bool)  # packed: (data, batch_sizes, hx, weights, bias, layers, p, train, bidir)
    if packed:
        inp, batch_sizes, hx, weights, has_biases, num_layers, _dropout, _train, bidirectional = args
        batch_first = False
    else:
        inp, hx, weights, has_biases, num_layers, _dropout, _train, bidirectional, batch_first = args
    states = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
    directions = 2 if bidirectional else 1
    per_layer = (4 if has_biases else 2) * directions
    if (inp.dim() != (2 if packed else 3) or len(weights) != per_layer * num_layers
            or any(st.dim() != 3 for st in states)):
        return NotImplemented  # LSTM projections (proj_size) and unusual layouts
    emu = state.require()
    dtype = emu.autocast_dtype() or inp.dtype
    hidden = int(states[0].shape[-1])
    if packed:  # cuDNN walks len(batch_sizes) steps; step t works on batch_sizes[t] rows (priced at the largest)
        sizes = [int(b) for b in batch_sizes.tolist()]
        seq_len, batch, tokens, width = len(sizes), sizes[0], sum(sizes), int(inp.shape[1])
    else:
        seq_len, batch = (int(inp.shape[1]), int(inp.shape[0])) if batch_first else (int(inp.shape[0]),
                                                                                    int(inp.shape[1]))
        tokens, width = 0, int(inp.shape[2])
    shape = RnnShape(mode, seq_len, batch, width, hidden, int(num_layers), directions, bool(batch_first), dtype,
                     tokens)
    output, *finals = _FusedRNN.apply(shape, inp._index, len(states), inp, *states, *weights)
    if mode == "lstm":
        return output, finals[0], finals[1]
    return output, finals[0]


# -- packed sequences: the batch sizes are host (CPU) values, so packing is a gather of known size -----------------


def _copied(index: int, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Return a new emulated tensor of `shape` filled by a gather/scatter copy, charged as such on device `index`."""
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    spec = state.require().devices[index].spec
    charge(index, name, cost_time_s(OpCost(0.0, 2.0 * out.numel() * out.element_size(), "copy"), name, spec))
    return out


class _Pack(torch.autograd.Function):
    """`_pack_padded_sequence`: padded (T, B, *) -> packed data (sum(lengths), *) plus CPU batch sizes."""

    @staticmethod
    def forward(ctx: Any, inp: EmuTensor, lengths: torch.Tensor, batch_first: bool) -> Any:  # type: ignore[override]
        lens = [int(x) for x in lengths.tolist()]
        if any(a < b for a, b in itertools.pairwise(lens)) or not lens or lens[-1] <= 0:
            raise ValueError("`lengths` array must be sorted in decreasing order and contain positive lengths "
                             "(pack_padded_sequence(enforce_sorted=True))")
        batch_sizes = torch.tensor([sum(1 for n in lens if n > t) for t in range(lens[0])], dtype=torch.int64)
        data = _copied(inp._index, "pack_padded_sequence", (sum(lens), *inp.shape[2:]), inp)
        ctx.in_shape, ctx.index = tuple(inp.shape), inp._index
        ctx.mark_non_differentiable(batch_sizes)
        return data, batch_sizes

    @staticmethod
    def backward(ctx: Any, grad_data: Any, _grad_sizes: Any) -> Any:
        return _copied(ctx.index, "pack_padded_sequence_backward", ctx.in_shape, grad_data), None, None


class _Pad(torch.autograd.Function):
    """`_pad_packed_sequence`: packed data + CPU batch sizes -> padded (T, B, *) plus CPU lengths."""

    @staticmethod
    def forward(ctx: Any, data: EmuTensor, batch_sizes: torch.Tensor, batch_first: bool, padding_value: float,  # type: ignore[override]
                total_length: int) -> Any:
        sizes = [int(b) for b in batch_sizes.tolist()]
        steps, batch = max(len(sizes), int(total_length)), sizes[0]
        lengths = torch.tensor([sum(1 for b in sizes if b > i) for i in range(batch)], dtype=torch.int64)
        rest = tuple(data.shape[1:])
        shape = (batch, steps, *rest) if batch_first else (steps, batch, *rest)
        out = _copied(data._index, "pad_packed_sequence", shape, data)
        ctx.data_shape, ctx.index = tuple(data.shape), data._index
        ctx.mark_non_differentiable(lengths)
        return out, lengths

    @staticmethod
    def backward(ctx: Any, grad_out: Any, _grad_lengths: Any) -> Any:
        return _copied(ctx.index, "pad_packed_sequence_backward", ctx.data_shape, grad_out), None, None, None, None


def _patched_pack(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def pack(inp: Any, lengths: Any, batch_first: bool) -> Any:
        if not isinstance(inp, EmuTensor):
            return original(inp, lengths, batch_first)
        if batch_first:  # torch packs time-major: transpose first, as its kernel does
            inp = inp.transpose(0, 1)
        return _Pack.apply(inp, lengths.cpu() if isinstance(lengths, torch.Tensor) else torch.as_tensor(lengths),
                           False)

    return pack


def _patched_pad(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def pad(data: Any, batch_sizes: Any, batch_first: bool, padding_value: float, total_length: int) -> Any:
        if not isinstance(data, EmuTensor):
            return original(data, batch_sizes, batch_first, padding_value, total_length)
        return _Pad.apply(data, batch_sizes, batch_first, padding_value, total_length)

    return pad


def _routed(call: Callable[[str, tuple[Any, ...]], Any], mode: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """Return `original` wrapped so that positional calls go to `call(mode, args)` first (NotImplemented: original)."""

    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            result = call(mode, args)
            if result is not NotImplemented:
                return result
        return original(*args, **kwargs)

    return routed


def patched(mode: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """Return a `_VF.<mode>` replacement that runs emulated inputs as one fused call (see Note [Fused RNN])."""
    return _routed(_emulated_call, mode, original)


def _cell_call(mode: str, args: tuple[Any, ...]) -> Any:
    """Return the CUDA composition of one LSTM/GRU cell step, or NotImplemented (see Note [Fused RNN cells])."""
    if len(args) < 4 or not isinstance(args[0], EmuTensor):
        return NotImplemented
    inp, hx, w_ih, w_hh = args[:4]
    b_ih = args[4] if len(args) > 4 else None
    b_hh = args[5] if len(args) > 5 else None
    states = tuple(hx) if mode == "lstm_cell" else (hx,)
    tensors = [inp, *states, w_ih, w_hh, *(b for b in (b_ih, b_hh) if b is not None)]
    if inp.dim() != 2 or any(not isinstance(t, EmuTensor) or t.device != inp.device for t in tensors):
        return NotImplemented
    igates = torch.mm(inp, w_ih.t())
    hgates = torch.mm(states[0], w_hh.t())
    if mode == "lstm_cell":
        hy, cy, _workspace = torch.ops.aten._thnn_fused_lstm_cell(igates, hgates, states[1], b_ih, b_hh)
        return hy, cy
    hy, _workspace = torch.ops.aten._thnn_fused_gru_cell(igates, hgates, states[0], b_ih, b_hh)
    return hy


def patched_cell(mode: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """Return a `_VF.<mode>_cell` replacement that runs emulated inputs as CUDA does (see Note [Fused RNN cells])."""
    return _routed(_cell_call, mode, original)


def _patched_invert(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def invert_permutation(permutation: Any) -> Any:
        from gpemu.torch_backend.ops import known_value, set_known_value

        value = known_value(permutation) if isinstance(permutation, EmuTensor) else None
        out = original(permutation)
        if value is not None:  # the sort ran on the host: its inverse is host work too, and pad_packed needs it
            inverse = torch.empty_like(value)
            inverse[value] = torch.arange(value.numel(), dtype=value.dtype)
            set_known_value(out, inverse)
        return out

    return invert_permutation


def apply(patcher: Any) -> None:
    """Install the fused RNN entry points on torch._VF through `patcher`."""
    from torch import _VF

    for mode in GATES:
        original = getattr(_VF, mode, None)
        if original is not None:
            patcher.set(_VF, mode, patched(mode, original))
    for mode in ("lstm_cell", "gru_cell"):
        patcher.set(_VF, mode, patched_cell(mode, getattr(_VF, mode)))
    patcher.set(_VF, "_pack_padded_sequence", _patched_pack(_VF._pack_padded_sequence))
    import torch.nn.utils.rnn as rnn_utils

    patcher.set(rnn_utils, "invert_permutation", _patched_invert(rnn_utils.invert_permutation))
    # nn.RNN.flatten_parameters asks cudnn.is_acceptable, which checks the installed cuDNN against the device's
    # compute capability (cuDNN >= 9.11 refuses sm < 7.5): the emulated GPU runs whatever cuDNN its owner would
    import torch.backends.cudnn as cudnn

    original_acceptable = cudnn.is_acceptable

    @functools.wraps(original_acceptable)
    def is_acceptable(tensor: torch.Tensor) -> bool:
        if isinstance(tensor, EmuTensor):
            return bool(cudnn.enabled) and tensor.dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                             torch.float64)
        return bool(original_acceptable(tensor))

    patcher.set(cudnn, "is_acceptable", is_acceptable)
    patcher.set(_VF, "_pad_packed_sequence", _patched_pad(_VF._pad_packed_sequence))

