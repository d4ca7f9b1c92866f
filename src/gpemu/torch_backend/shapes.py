"""Fast shape functions for hot aten ops (torch's Python meta kernels cost 0.1-5 ms per call).

See Note [Host overhead]: the emulator's CPU time steals cores from the data pipeline, so the ops a training step
runs hundreds of times get hand-written output shapes here. Each function returns the meta outputs, or
NotImplemented to fall back to torch's meta kernel (unusual strides, broadcasting, dtype promotion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
META = torch.device("meta")
FAST: dict[Any, Callable[[Any, Any], Any]] = {}
_LOW = (torch.float16, torch.bfloat16)


def _fast(*ops: Any) -> Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]:
    def deco(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        for op in ops:
            FAST[op] = fn
        return fn

    return deco


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW else dtype


# Note [Output strides of fast shape functions]: an op's output strides decide later ops: `.view()` works or fails,
# and F.linear folds a contiguous N-d input into one addmm where a strided one goes through matmul (a copy and an mm,
# or a bmm over a broadcast weight). The fast functions used to give every output its input's strides. Two cases
# differ from torch's CUDA kernels: (1) a non-dense input (a slice, `x[:, :10]`): TensorIterator and empty_like
# allocate a new dense tensor in the input's dimension order, so `(x[:, :10] * 2).view(-1)` and
# `x[:, :10].clone().view(-1)` work on a GPU; under emulation the output kept the slice's gaps and `.view(-1)` failed;
# (2) native_layer_norm and its backward make their input contiguous and return contiguous outputs (torch's meta
# kernel for the backward keeps the input's strides: the CUDA kernel is the reference). ConvNeXt's blocks call
# LayerNorm on a permuted (N, H, W, C) view: the output kept the permutation, so the following nn.Linear ran as a
# copy + mm and, in a copy whose weights do not require grad (timm's ModelEma), as a bmm priced 26x the mm (the EMA
# model's evaluation read 50.5 ms of GPU where the model's own read 17.1 ms, ConvNeXt-T at batch 32, amp, A100).
def _dense_order_strides(t: torch.Tensor) -> tuple[int, ...]:
    """Return t's strides if it is non-overlapping and dense, else dense strides in t's dimension order."""
    expected = 1
    for d in sorted(range(t.dim()), key=t.stride):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            break
        expected *= t.shape[d]
    else:
        return tuple(t.stride())
    strides = [0] * t.dim()
    step = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), -d)):  # innermost first; ties keep dim order
        strides[d] = step
        step *= max(int(t.shape[d]), 1)
    return tuple(strides)


def _like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    # empty_strided, not empty_like: empty_like on meta runs a Python prims decomposition (~100 us)
    if t.is_contiguous():
        return torch.empty(t.shape, dtype=dtype or t.dtype, device=META)
    return torch.empty_strided(t.shape, _dense_order_strides(t), dtype=dtype or t.dtype, device=META)


def _contiguous(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(t.shape, dtype=dtype or t.dtype, device=META)


def _vec(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((n,), dtype=dtype, device=META)


# ---- elementwise: same shape, dtype and strides in every tensor argument -> output like the first -------------


def _elementwise(args: Any, kwargs: Any) -> Any:
    first = args[0]
    if not isinstance(first, torch.Tensor) or not first.is_floating_point():
        return NotImplemented
    for a in args[1:]:
        if isinstance(a, torch.Tensor) and (a.shape != first.shape or a.dtype != first.dtype or a.stride() != first.stride()):
            return NotImplemented
    if kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return NotImplemented
    return _like(first)


for _name in (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "add.Scalar", "mul.Scalar", "div.Scalar", "sub.Scalar",
    "relu.default", "threshold_backward.default", "sigmoid.default", "tanh.default", "gelu.default",
    "gelu_backward.default", "silu.default", "silu_backward.default", "neg.default", "exp.default", "sqrt.default",
    "rsqrt.default", "hardtanh.default", "hardtanh_backward.default", "sigmoid_backward.default",
    "tanh_backward.default", "native_dropout_backward.default", "clone.default", "pow.Tensor_Scalar",
    "addcmul.default", "addcdiv.default", "lerp.Scalar", "maximum.default", "minimum.default", "abs.default",
    "_to_copy.default", "hardswish.default", "hardswish_backward.default", "hardsigmoid.default",
    "hardsigmoid_backward.default", "leaky_relu.default", "leaky_relu_backward.default", "relu6.default",
):
    _packet, _, _overload = _name.partition(".")
    if hasattr(aten, _packet) and hasattr(getattr(aten, _packet), _overload):
        FAST[getattr(getattr(aten, _packet), _overload)] = _elementwise


@_fast(aten.mul.out, aten.div.out, aten.add.out)
def _binary_out(args: Any, kwargs: Any) -> Any:
    """`out=` variants with a same-shaped tensor and a 0-dim or same-shaped one (DDP's gradient-into-bucket scaling:
    Note [DDP on one rank]); the Python reference meta for them costs ~1 ms a call."""
    out = kwargs.get("out")
    first = args[0] if args else None
    if not isinstance(out, torch.Tensor) or not isinstance(first, torch.Tensor) or set(kwargs) - {"out", "alpha"}:
        return NotImplemented
    other = args[1] if len(args) > 1 else None
    if out.shape != first.shape or out.dtype != first.dtype or not first.is_floating_point():
        return NotImplemented
    if isinstance(other, torch.Tensor) and other.dim() != 0 and other.shape != first.shape:
        return NotImplemented
    return out


@_fast(aten._to_copy.default)
def _to_copy(args: Any, kwargs: Any) -> Any:
    x = args[0]
    extra = set(kwargs) - {"dtype", "device", "layout", "non_blocking", "pin_memory"}
    if extra or len(args) > 1:
        return NotImplemented
    return _like(x, kwargs.get("dtype") or x.dtype)


@_fast(aten.clone.default)
def _clone(args: Any, kwargs: Any) -> Any:
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return NotImplemented
    return _like(args[0])


# ---- normalisation -------------------------------------------------------------------------------------------


@_fast(aten.native_batch_norm.default)
def _batch_norm(args: Any, kwargs: Any) -> Any:
    x = args[0]
    training = args[5] if len(args) > 5 else kwargs.get("training", True)
    c = x.shape[1] if x.dim() > 1 else x.shape[0]
    stats = c if training else 0
    return _like(x), _vec(stats, _acc(x.dtype)), _vec(stats, _acc(x.dtype))


@_fast(aten.native_batch_norm_backward.default)
def _batch_norm_backward(args: Any, kwargs: Any) -> Any:
    _grad, x, weight = args[0], args[1], args[2]
    mask = args[9] if len(args) > 9 else kwargs["output_mask"]
    c = x.shape[1] if x.dim() > 1 else x.shape[0]
    wdtype = weight.dtype if weight is not None else _acc(x.dtype)
    return (
        _like(x) if mask[0] else None,
        _vec(c, wdtype) if mask[1] else None,
        _vec(c, wdtype) if mask[2] else None,
    )


@_fast(aten.native_layer_norm.default)
def _layer_norm(args: Any, kwargs: Any) -> Any:
    x, normalized_shape = args[0], args[1]
    axis = x.dim() - len(normalized_shape)
    stat_shape = tuple(x.shape[:axis]) + (1,) * len(normalized_shape)
    acc = _acc(x.dtype)
    # contiguous whatever the input's strides (Note [Output strides of fast shape functions])
    stats = torch.empty(stat_shape, dtype=acc, device=META), torch.empty(stat_shape, dtype=acc, device=META)
    return _contiguous(x), *stats


@_fast(aten.native_layer_norm_backward.default)
def _layer_norm_backward(args: Any, kwargs: Any) -> Any:
    _grad, x, _shape, _mean, _rstd, weight, bias, mask = args[:8]
    return (
        _contiguous(x) if mask[0] else None,
        _like(weight) if mask[1] and weight is not None else None,
        _like(bias) if mask[2] and bias is not None else None,
    )


# ---- convolution ---------------------------------------------------------------------------------------------


@_fast(aten.convolution.default)
def _convolution(args: Any, kwargs: Any) -> Any:
    x, weight, _bias, stride, padding, dilation, transposed, _out_pad, _groups = args[:9]
    if transposed or x.dim() != 4 or weight.dim() != 4:
        return NotImplemented
    n, _, h, w = x.shape
    k_h, k_w = weight.shape[2], weight.shape[3]
    h_out = (h + 2 * padding[0] - dilation[0] * (k_h - 1) - 1) // stride[0] + 1
    w_out = (w + 2 * padding[-1] - dilation[-1] * (k_w - 1) - 1) // stride[-1] + 1
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else (
        torch.contiguous_format
    )
    return torch.empty((n, weight.shape[0], h_out, w_out), dtype=x.dtype, device=META, memory_format=fmt)


@_fast(aten.convolution_backward.default)
def _convolution_backward(args: Any, kwargs: Any) -> Any:
    grad, x, weight, bias_sizes = args[:4]
    mask = args[10]
    return (
        _like(x) if mask[0] else None,
        _like(weight) if mask[1] else None,
        _vec(bias_sizes[0], grad.dtype) if mask[2] and bias_sizes is not None else None,
    )


# ---- losses and softmax --------------------------------------------------------------------------------------


@_fast(aten._log_softmax.default, aten._softmax.default)
def _softmax(args: Any, kwargs: Any) -> Any:
    x, _dim, half_to_float = args[:3]
    return _like(x, torch.float32 if half_to_float else x.dtype)


@_fast(aten._log_softmax_backward_data.default, aten._softmax_backward_data.default)
def _softmax_backward(args: Any, kwargs: Any) -> Any:
    grad, _out, _dim, input_dtype = args[:4]
    return _like(grad, input_dtype)


@_fast(aten.nll_loss_forward.default)
def _nll_loss_forward(args: Any, kwargs: Any) -> Any:
    x, _target, _weight, reduction = args[:4]
    shape = (x.shape[0],) if reduction == 0 and x.dim() > 1 else ()
    return torch.empty(shape, dtype=x.dtype, device=META), torch.empty((), dtype=x.dtype, device=META)


@_fast(aten.nll_loss_backward.default)
def _nll_loss_backward(args: Any, kwargs: Any) -> Any:
    return _like(args[1])


# ---- fused recurrent cells (Note [Fused RNN cells] in rnn.py): CUDA-only ops without a meta kernel -----------


@_fast(aten._thnn_fused_lstm_cell.default)
def _fused_lstm_cell(args: Any, kwargs: Any) -> Any:
    cx = args[2]  # (input_gates [B, 4H], hidden_gates [B, 4H], cx [B, H], biases) -> (hy, cy, workspace [B, 4H])
    # torch's meta kernel reads .device of the optional biases: LSTMCell(bias=False) failed there
    return _like(cx), _like(cx), torch.empty((cx.shape[0], 4 * cx.shape[1]), dtype=cx.dtype, device=META)


@_fast(aten._thnn_fused_lstm_cell_backward_impl.default)
def _fused_lstm_cell_backward(args: Any, kwargs: Any) -> Any:
    _grad_hy, _grad_cy, cx, _cy, workspace, has_bias = args[:6]  # either output gradient may be undefined (None)
    bias = _vec(workspace.shape[1], workspace.dtype) if has_bias else None
    return _like(workspace), _like(cx), bias


@_fast(aten._thnn_fused_gru_cell.default)
def _fused_gru_cell(args: Any, kwargs: Any) -> Any:
    hx = args[2]  # (input_gates [B, 3H], hidden_gates [B, 3H], hx [B, H], biases) -> (hy, workspace [B, 5H])
    return _like(hx), torch.empty((hx.shape[0], 5 * hx.shape[1]), dtype=hx.dtype, device=META)


@_fast(aten._thnn_fused_gru_cell_backward.default)
def _fused_gru_cell_backward(args: Any, kwargs: Any) -> Any:
    grad_hy, _workspace, has_bias = args[:3]
    b, h = grad_hy.shape
    gates = torch.empty((b, 3 * h), dtype=grad_hy.dtype, device=META)
    bias = _vec(3 * h, grad_hy.dtype) if has_bias else None
    return gates, torch.empty_like(gates), _like(grad_hy), bias, None if bias is None else torch.empty_like(bias)


# ---- foreach (optimizers) ------------------------------------------------------------------------------------


def _foreach(args: Any, kwargs: Any) -> Any:
    return [_like(t) for t in args[0]]


def _foreach_inplace(args: Any, kwargs: Any) -> Any:
    return None


def _foreach_norm(args: Any, kwargs: Any) -> Any:
    return [torch.empty((), dtype=t.dtype, device=META) for t in args[0]]


for _packet_name in dir(aten):
    if not _packet_name.startswith("_foreach_"):
        continue
    _packet = getattr(aten, _packet_name)
    for _overload in _packet.overloads():
        _op = getattr(_packet, _overload)
        if _packet_name in ("_foreach_norm", "_foreach_max"):
            FAST[_op] = _foreach_norm
        elif _packet_name.endswith("_") and _overload != "out":
            FAST[_op] = _foreach_inplace
        elif _overload != "out":
            FAST[_op] = _foreach
