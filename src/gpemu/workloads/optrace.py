"""Trace one training step's aten ops on the `meta` device (no memory, no math) with per-op FLOPs and bytes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpemu.cost.registry import op_cost, op_name, tensor_layout
from gpemu.errors import GpemuError, UnknownNameError
from gpemu.paths import cache_dir

TRACE_VERSION = 11  # bump when what a trace records changes (invalidates the disk cache)
TRACE_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "amp", "amp_bf16")
OPTIMIZERS: tuple[str, ...] = ("sgd", "sgd-gpemu", "adam", "adamw")
# Note [GPEmu-era step]
# "sgd" is today's CUDA default: zero_grad(set_to_none=True) and the multi-tensor (foreach) SGD-momentum step.
# "sgd-gpemu" reproduces how GPEmu's "backward" rows were measured (torch 1.x era, evidence: the measured backward
# overhead grows with the number of parameter tensors): zero_grad() fills existing grads with zeros (one
# _foreach_zero_), backward accumulates into them (one add_ per parameter), and SGD-momentum runs the per-parameter
# loop (mul_, add_ on the momentum buffer, add_ on the parameter). The calibration fits on "sgd-gpemu" traces.
TRACE_PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
INFERENCE = "inference"  # the "optimizer" slot of an inference trace's cache key: Note [Inference forward]
# Note [Inference forward]
# An inference forward is not a training forward without the backward: model.eval() switches batch norm to its
# running statistics (one read and one write of the activations, where training mode also reduces over the batch for
# the mean and variance and saves them), dropout to the identity (no mask drawn, nothing written), and torch.no_grad()
# keeps autograd from saving anything. trace_inference records that forward (eval mode, no_grad, autocast for "amp"),
# as timm's benchmark.py, torchvision's reference evaluation and serving code run it; its ops carry phase "forward"
# and are priced with the forward phase's constants (gpemu.cost.predict, phase "inference").
MEMORY_FORMATS: tuple[str, ...] = ("nchw", "channels_last")  # "nchw" = torch.contiguous_format
InputsFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class OpRecord:
    """One aten op of a traced step: what ran, in which phase, its shapes and its GPU-independent cost."""

    name: str  # aten op name, e.g. "convolution"
    phase: str  # forward | backward (loss + zero_grad + backward) | optimizer (step)
    category: str
    flops: float
    bytes: float
    dtype: str  # compute dtype key
    tensor_core: bool
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...] = ()
    layout: str = ""  # conv / batch-norm ops: "nchw" or "nhwc" (Note [Memory format] in gpemu.cost.registry)
    relayout_bytes: float = 0.0  # conv ops: activation bytes (what a cuDNN layout transpose reads and writes once)
    channel_elems: float = 0.0  # NCHW training batch norm: N*H*W (Note [Batch norm, one block per channel])
    gemm_align: int = 8  # GEMMs: element alignment of K and N (Note [Misaligned GEMMs on Hopper])

    @property
    def gpemu_phase(self) -> str:
        """Return the phase as GPEmu reports it ("backward" includes the optimizer step)."""
        return "forward" if self.phase == "forward" else "backward"


def _shapes(tree: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    shapes: list[tuple[int, ...]] = []
    dtypes: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            shapes.append(tuple(int(s) for s in x.shape))
            dtypes.append(str(x.dtype).replace("torch.", ""))
        elif isinstance(x, (list, tuple)):
            for item in x:
                walk(item)

    walk(tree)
    return tuple(shapes), tuple(dtypes)


_CONV_OPS = frozenset({torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default})


def _conv_memory_format(func: Any, args: Sequence[Any], out: Any) -> Any:
    """Return a convolution's outputs in channels_last when cuDNN would give them that format: meta's shape function
    takes the CPU route and returns NCHW (Note [Routing on meta]); CUDA picks channels_last when the input or the
    weight is channels_last (cudnn_conv_suggest_memory_format), for the output, grad_input and grad_weight."""
    if func not in _CONV_OPS:
        return out
    tensors = [a for a in args[:3] if isinstance(a, torch.Tensor)]
    if not any(tensor_layout(t) == "nhwc" for t in tensors):
        return out
    to_cl = lambda t: (t.contiguous(memory_format=torch.channels_last)  # noqa: E731
                       if isinstance(t, torch.Tensor) and t.dim() == 4 else t)
    if isinstance(out, tuple):
        return tuple(to_cl(t) for t in out)
    return to_cl(out)


class _Recorder(TorchDispatchMode):
    """Records every aten op with its cost; `phase` is switched by the driver."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = _conv_memory_format(func, args, func(*args, **kwargs))
        cost = op_cost(func, args, kwargs, out)
        in_shapes, in_dtypes = _shapes((list(args), list(kwargs.values())))
        out_shapes, _ = _shapes(out)
        self.records.append(OpRecord(op_name(func), self.phase, cost.category, float(cost.flops), float(cost.bytes),
                                     cost.dtype, cost.tensor_core, in_shapes, out_shapes, in_dtypes, cost.layout,
                                     float(cost.relayout_bytes), float(cost.channel_elems), int(cost.gemm_align)))
        return out


# Note [Routing on meta]
# C++ sees `meta`, so CUDA-only kernel choices are made here, in Python, above autograd, by patching a few
# torch.nn.functional / torch functions for the duration of a trace (the patches pass non-meta tensors through
# untouched). A TorchFunctionMode would not do: it is disabled inside its own handler, so it misses calls nested in
# Python functionals (nn.MultiheadAttention -> F.multi_head_attention_forward -> F.scaled_dot_product_attention).
#  - F.scaled_dot_product_attention -> aten._scaled_dot_product_flash_attention for 16-bit inputs without a mask
#    (head dim <= 256), else aten._scaled_dot_product_efficient_attention (fp32 or masked), as CUDA's dispatcher
#    picks on sm80+; both have meta kernels and derivatives, so backward gets the fused backward op.
#  - F.dropout (training) -> aten.native_dropout (CUDA's fused dropout; meta would otherwise decompose it).
#  - autocast ("amp"): meta tensors carry no AutocastCUDA key, so torch.autocast does nothing there. We emulate its
#    op lists: the lower-precision list (linear, conv*, matmul family, SDPA) casts fp32 inputs to fp16/bf16 with a
#    differentiable .to() (a `_to_copy` op each, as autocast issues); the fp32 list (softmax, log_softmax,
#    layer_norm, group_norm, cross_entropy, nll_loss) casts 16-bit inputs back to fp32. Everything else runs in the
#    dtype it receives, with type promotion, as under autocast. Batch norm receives fp16 activations and fp32
#    weights, like cuDNN's mixed batch norm. Autocast's weight-cast cache is not emulated (one cast per use).
_LOWER_F = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_LOWER_TORCH = ("matmul", "mm", "bmm", "addmm", "baddbmm")
_FP32_F = ("softmax", "log_softmax", "layer_norm", "group_norm", "cross_entropy", "nll_loss")


def _is_meta(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.device.type == "meta"
    if isinstance(tree, (list, tuple)):
        return any(_is_meta(x) for x in tree)
    return False


def _cast(tree: Any, dtype: torch.dtype, src: tuple[torch.dtype, ...]) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() and tree.dtype in src else tree
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cast(x, dtype, src) for x in tree)
    return tree


def _caster(orig: Any, dtype: torch.dtype, src: tuple[torch.dtype, ...]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_meta(args):
            args = _cast(args, dtype, src)
            kwargs = {k: _cast(v, dtype, src) for k, v in kwargs.items()}
        return orig(*args, **kwargs)

    return wrapper


def _routed_sdpa(orig: Any, amp_dtype: torch.dtype | None) -> Any:
    aten = torch.ops.aten

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, **kw: Any) -> torch.Tensor:
        if q.device.type != "meta" or kw:
            return orig(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)  # type: ignore[no-any-return]
        if amp_dtype is not None:
            q, k, v = _cast((q, k, v), amp_dtype, (torch.float32,))
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
        return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal,
                                                            scale=scale)[0]

    return sdpa


def _routed_dropout(orig: Any) -> Any:
    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if input.device.type == "meta" and training and 0.0 < p < 1.0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return orig(input, p, training, inplace)  # type: ignore[no-any-return]

    return dropout


@contextlib.contextmanager
def _routing(amp_dtype: torch.dtype | None) -> Iterator[None]:
    """Patch torch for CUDA kernel routing and autocast emulation on meta. See Note [Routing on meta]."""
    patches: list[tuple[Any, str, Any]] = [
        (F, "scaled_dot_product_attention", _routed_sdpa(F.scaled_dot_product_attention, amp_dtype)),
        (F, "dropout", _routed_dropout(F.dropout)),
    ]
    if amp_dtype is not None:
        patches += [(F, n, _caster(getattr(F, n), amp_dtype, (torch.float32,))) for n in _LOWER_F]
        patches += [(torch, n, _caster(getattr(torch, n), amp_dtype, (torch.float32,))) for n in _LOWER_TORCH]
        patches += [(torch.Tensor, n, _caster(getattr(torch.Tensor, n), amp_dtype, (torch.float32,)))
                    for n in ("__matmul__", "matmul")]
        patches += [(F, n, _caster(getattr(F, n), torch.float32, (torch.float16, torch.bfloat16))) for n in _FP32_F]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, new in patches:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _check(dtype: str, optimizer: str, memory_format: str = "nchw") -> None:
    if dtype not in TRACE_DTYPES:
        raise UnknownNameError("dtype", dtype, TRACE_DTYPES)
    if optimizer not in OPTIMIZERS:
        raise UnknownNameError("optimizer", optimizer, OPTIMIZERS)
    if memory_format not in MEMORY_FORMATS:
        raise GpemuError(f"unknown memory format {memory_format!r}: use one of {', '.join(MEMORY_FORMATS)}")


def _make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    # foreach=True: the multi-tensor implementation CUDA uses by default since torch 2.0 (meta would pick the loop).
    if name in ("sgd", "sgd-gpemu"):
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=name == "sgd")
        for p in params:  # steady state: momentum buffers exist (step 1 would clone instead of update)
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return opt
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    opt = cls(params, lr=1e-3, foreach=True, capturable=False)
    for p in params:
        opt.state[p].update(step=torch.tensor(1.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return opt


def _trace_uncached(model: nn.Module, name: str, batch_size: int, dtype: str, optimizer: str,
                    inputs_fn: InputsFn | None = None, memory_format: str = "nchw") -> list[OpRecord]:
    from gpemu.workloads.models import example_batch, loss_fn, model_kind

    if dtype in ("fp16", "bf16"):
        model = model.to(_DTYPES[dtype])
    model.train()
    if inputs_fn is not None:
        inputs, targets = inputs_fn(batch_size)
    else:
        kind = model_kind(name) if not name.startswith("<") else "vision"
        inputs, targets = example_batch(name if kind == "lm" else "resnet18", batch_size, device="meta")
    if dtype in ("fp16", "bf16") and inputs.is_floating_point():
        inputs = inputs.to(_DTYPES[dtype])
    if memory_format == "channels_last":  # what a user's script does: model.to(...) and images.to(...)
        model = model.to(memory_format=torch.channels_last)
        if inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
    amp = {"amp": torch.float16, "amp_bf16": torch.bfloat16}.get(dtype)
    recorder = _Recorder()
    if optimizer == INFERENCE:  # See Note [Inference forward]
        model.eval()
        with torch.no_grad(), _routing(amp), recorder:
            model(inputs)
        return recorder.records
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _make_optimizer(optimizer, params)
    legacy = optimizer == "sgd-gpemu"  # See Note [GPEmu-era step]
    if legacy:
        for p in params:
            p.grad = torch.zeros_like(p)
    with _routing(amp), recorder:
        out = model(inputs)
        if not isinstance(out, torch.Tensor):  # e.g. GoogLeNetOutputs / dicts: train on the main logits
            out = out[0] if isinstance(out, (tuple, list)) else out["out"]
        recorder.phase = "backward"
    with _routing(None), recorder:  # autocast ends before the loss's backward (the loss itself is on the fp32 list)
        loss = loss_fn(name, out.float() if amp is not None else out, targets)
        opt.zero_grad(set_to_none=not legacy)
        loss.backward()
        recorder.phase = "optimizer"
        opt.step()
    return recorder.records


def build_on_meta(name: str) -> nn.Module:
    """Return a zoo model whose parameters and buffers live on meta (no memory, no init cost)."""
    from gpemu.workloads.models import build_model

    try:
        with torch.device("meta"):
            return build_model(name)
    except NotImplementedError:
        pass  # the constructor computes with tensors (regnet's width schedule): build on CPU, params on meta
    old_param, old_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def register_parameter(self: nn.Module, pname: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        old_param(self, pname, param)

    def register_buffer(self: nn.Module, bname: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        old_buffer(self, bname, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign, assignment]
    nn.Module.register_buffer = register_buffer  # type: ignore[method-assign, assignment]
    try:
        return build_model(name)
    finally:
        nn.Module.register_parameter = old_param  # type: ignore[method-assign, assignment]
        nn.Module.register_buffer = old_buffer  # type: ignore[method-assign, assignment]


def _cache_path(model: str, batch_size: int, dtype: str, optimizer: str, memory_format: str = "nchw") -> Path:
    fmt = "" if memory_format == "nchw" else f"|{memory_format}"
    key = f"{model}|{batch_size}|{dtype}|{optimizer}{fmt}|{torch.__version__}|v{TRACE_VERSION}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in model)
    suffix = "" if memory_format == "nchw" else f"-{memory_format}"
    return cache_dir() / "optrace" / f"{safe}-b{batch_size}-{dtype}-{optimizer}{suffix}-{digest}.json"


def _load(path: Path) -> list[OpRecord] | None:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    out = []
    for r in rows:
        r["in_shapes"] = tuple(tuple(s) for s in r["in_shapes"])
        r["out_shapes"] = tuple(tuple(s) for s in r["out_shapes"])
        r["in_dtypes"] = tuple(r["in_dtypes"])
        out.append(OpRecord(**r))
    return out


def _store(path: Path, records: list[OpRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps([asdict(r) for r in records], separators=(",", ":")))
    os.replace(tmp, path)


def trace_training_step(model_name_or_module: str | nn.Module, batch_size: int, dtype: str = "fp32",
                        optimizer: str = "sgd", cache: bool = True,
                        inputs_fn: InputsFn | None = None, memory_format: str = "nchw") -> list[OpRecord]:
    """Return the aten ops of one training step (forward, loss, zero_grad, backward, optimizer step), traced on meta.

    Zoo names (and "module:factory" refs) are cached on disk under platformdirs.user_cache_dir("gpemu") (or
    $GPEMU_CACHE_DIR) keyed by (model, batch, dtype, optimizer, memory format, torch version); modules are traced
    every time. `inputs_fn(batch_size) -> (inputs, targets)` on meta overrides the zoo's example batch (default:
    images). memory_format="channels_last" converts the model and a 4-D input batch to NHWC first.
    """
    _check(dtype, optimizer, memory_format)
    return _trace(model_name_or_module, batch_size, dtype, optimizer, cache, inputs_fn, memory_format)


def trace_inference(model_name_or_module: str | nn.Module, batch_size: int, dtype: str = "fp32", cache: bool = True,
                    inputs_fn: InputsFn | None = None, memory_format: str = "nchw") -> list[OpRecord]:
    """Return the aten ops of one inference forward (model.eval(), torch.no_grad()), traced on meta and cached as
    trace_training_step's are (Note [Inference forward])."""
    _check(dtype, "sgd", memory_format)
    return _trace(model_name_or_module, batch_size, dtype, INFERENCE, cache, inputs_fn, memory_format)


def _trace(model_name_or_module: str | nn.Module, batch_size: int, dtype: str, optimizer: str, cache: bool,
           inputs_fn: InputsFn | None, memory_format: str) -> list[OpRecord]:
    if isinstance(model_name_or_module, nn.Module):
        module = model_name_or_module
        if any(p.device.type != "meta" for p in module.parameters()):
            module = module.to("meta")
        return _trace_uncached(module, "<module>", batch_size, dtype, optimizer, inputs_fn, memory_format)
    name = model_name_or_module
    path = _cache_path(name, batch_size, dtype, optimizer, memory_format)
    if cache and (hit := _load(path)) is not None:
        return hit
    module = build_on_meta(name)
    records = _trace_uncached(module, name, batch_size, dtype, optimizer, memory_format=memory_format)
    if cache:
        with contextlib.suppress(OSError):  # a read-only cache dir costs speed, not correctness
            _store(path, records)
    return records
