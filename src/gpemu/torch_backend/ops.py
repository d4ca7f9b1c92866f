"""Special aten ops on emulated tensors: copies between host and device, values (.item), data-dependent shapes."""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend import state
from gpemu.torch_backend import tensor as _tensor_mod
from gpemu.torch_backend.tensor import (
    META,
    EmuTensor,
    _first_index,
    call_meta,
    charge,
    op_cost_s,
    run_op,
    to_meta,
    unwrap_all,
    wrap,
    wrap_outputs,
)

aten = torch.ops.aten
SPECIAL: dict[Any, Callable[[Any, Any, Any], Any]] = {}


def _special(*ops: Any) -> Callable[[Callable[[Any, Any, Any], Any]], Callable[[Any, Any, Any], Any]]:
    def deco(fn: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
        for op in ops:
            SPECIAL[op] = fn
        return fn

    return deco


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---- values --------------------------------------------------------------------------------------------------


# Answers for reads of computed values that gpemu itself supplies inside a library routine, innermost last, consulted
# after the user's value hook (Note [Beam search under emulation] in hf_generate.py).
_read_answers: list[Callable[[tuple[int, ...], torch.dtype, str], Any]] = []


@contextlib.contextmanager
def read_answers(answer: Callable[[tuple[int, ...], torch.dtype, str], Any]) -> Iterator[None]:
    """Within the block, reads of computed values take `answer(shape, dtype, reason)` where it is not None."""
    _read_answers.append(answer)
    try:
        yield
    finally:
        _read_answers.pop()


def host_value(
    shape: tuple[int, ...], dtype: torch.dtype, reason: str, default: torch.Tensor | None = None
) -> torch.Tensor:
    """Return the CPU tensor a D2H copy yields: the value hook's answer, else `default`, else a `read_answers` one,
    else zeros."""
    emu = state.current_emulation()
    hook = emu.value_hook if emu is not None else None
    answers = [hook] if hook is not None else []
    if _read_answers and default is None:  # all()/any() checks keep their passing answers
        answers.append(_read_answers[-1])
    for answer in answers:
        value = answer(shape, dtype, reason)
        if value is not None:
            t = torch.as_tensor(value, dtype=dtype, device="cpu")
            return t.expand(shape).clone() if t.shape != shape else t.clone()
    if default is not None:
        return default.clone()
    if emu is not None and emu.float_value and dtype.is_floating_point:  # See Note [Reading computed values]
        return torch.full(shape, emu.float_value, dtype=dtype, device="cpu")
    if reason == "torch.save":  # See Note [Host zeros on demand]
        return host_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device="cpu")  # device=: a default device of cuda must not apply here


_LAZY_ZEROS_MIN_BYTES = 1 << 20


# Note [Host zeros on demand]: a host read of a computed tensor returns zeros, and a checkpoint of emulated tensors is
# made of such reads (`__reduce_ex__`: Note [Saving emulated tensors]). torch.save keeps every storage it pickled until
# it writes them all, which costs a GPU run nothing (its storages are on the card and are copied out one at a time as
# they are written) but made gpemu hold the whole checkpoint in host memory: litgpt's final save of TinyLlama-1.1B
# with AdamW (13.2 GB of weights and moments) grew the process to 23.6 GB and the kernel killed it on a 24 GB host;
# 4 x 256 MiB weights with Adam (3 GiB saved) grew it by 2.1 GiB. Large zeros for torch.save now come from calloc
# (numpy's zeros): fresh pages the kernel maps on first write, so a checkpoint that is only read to be written costs
# no resident memory. Only torch.save's reads take them: a `.cpu()` result is resident on a GPU run too, and its
# storage stays resizable as torch's own.
def host_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Return a CPU tensor of zeros; a large one's pages are untouched until written (Note [Host zeros on demand])."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if nbytes < _LAZY_ZEROS_MIN_BYTES or dtype.is_complex or dtype.itemsize > 8:
        return torch.zeros(shape, dtype=dtype, device="cpu")  # device=: a default device of cuda must not apply here
    import numpy as np

    raw = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))
    return raw.view(dtype).view(shape)


# Note [Reading computed values]: values are not computed, so a host read of a computed tensor returns zeros (or the
# value hook's answer). Host arithmetic on a read loss then fails where a real run would not: pytorch/examples
# super_resolution's `10 * log10(1 / mse.item())` divides by zero, `math.log(loss.item())` has no domain.
# GPEMU_FLOAT_VALUE=1 (install(float_value=1.0)) makes computed floating-point reads return that number instead;
# integer and bool reads stay 0/False (counts, masks, `if torch.isnan(loss)`), and GradScaler's found_inf stays 0
# (emulated gradients are finite), so its steps are not skipped.


# host-to-device copies of at most this many bytes remember their source (a step counter, a GradScaler scale, an RNG
# state): a D2H copy of that same, unmodified-by-identity tensor returns it. Bigger tensors read back as zeros.
KNOWN_VALUE_MAX_BYTES = 64 * 1024

# id(emulated tensor) -> (weakref to it, its host value): values the host computed anyway (randperm for a sampler),
# returned by D2H copies of that exact tensor instead of zeros. See Note [Emulated CUDA generators] in rng.py.
# A "default" entry (all/any results) only stands in for zeros: the value hook, when set, answers first.
# The entry also holds the tensor's version counter at recording: an in-place op on the device bumps it, and the
# value (which the device op did not compute) is then forgotten rather than returned stale.
_known: dict[int, tuple[weakref.ref[EmuTensor], torch.Tensor, bool, int]] = {}


def set_known_value(t: EmuTensor, value: torch.Tensor, default: bool = False, bumps: int = 0,
                    sources: frozenset[int] | None = None, expr: HostExpr | None = None) -> None:
    """Record the CPU value of emulated tensor `t`; `.cpu()`/`.tolist()`/`.item()` of `t` return it until `t` is
    modified in place (`bumps`: version increments torch will still make for the op being handled). `sources`: the
    host copies the value was computed from (None: `t` itself is one; empty: a constant); `expr`: how it was computed
    from them. See Note [Known values through small ops] and Note [Read programs]."""
    key = id(t)
    version = _version_of(t)
    _pending.pop(key, None)
    _known[key] = (weakref.ref(t, lambda _ref, key=key: _forget(key)), value, default,  # type: ignore[misc]
                   version + bumps if version >= 0 else version)
    if sources is None:
        _sources[key] = frozenset((key,))
        _exprs[key] = HostExpr(None, value=value)
    else:
        _sources[key] = sources
        if sources and expr is not None:
            _exprs[key] = expr
        else:
            _exprs.pop(key, None)


def _forget(key: int) -> None:
    _known.pop(key, None)
    _pending.pop(key, None)
    _sources.pop(key, None)
    _exprs.pop(key, None)


# Note [Read programs]: a forward that reads a value computed from its input batch on the host (transformers'
# `torch.all(attention_mask == 1)` before it drops an all-ones mask) takes the path that value picks. Keying replay on
# the input's whole value (its digest) never replays when every batch pads differently, although every batch reads
# the same answer (False) and runs the same ops. So each known value derived from host copies also keeps how it was
# computed (a HostExpr: the op and its operands, themselves HostExprs or constants; a host copy is a leaf), and the
# replay path keys a module call on the values its recorded reads would read for this call's inputs: it evaluates
# the reads' expressions on the inputs' host values (tiny CPU ops: masks, positions, counters) before it decides.


class HostExpr:
    """How a host-known value was computed: `func(*args, **kwargs)` (output `index` of a tuple; `inplace`: on a copy
    of args[0]) over operands that are HostExprs or constants, or a leaf (func None) holding a host copy's value."""

    __slots__ = ("args", "func", "index", "inplace", "kwargs", "value")

    def __init__(self, func: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, index: int = 0,
                 inplace: bool = False, value: torch.Tensor | None = None) -> None:
        self.func, self.args, self.kwargs, self.index, self.inplace, self.value = (
            func, args, kwargs or {}, index, inplace, value)

    def evaluate(self, bound: dict[int, torch.Tensor], memo: dict[int, Any] | None = None) -> Any:
        """Return this value recomputed with the leaves or subexpressions in `bound` (by id) replaced."""
        memo = {} if memo is None else memo
        key = id(self)
        if key in bound:
            return bound[key]
        if key in memo:
            return memo[key]
        if self.func is None:
            return self.value

        def ev(a: Any) -> Any:
            if isinstance(a, HostExpr):
                return a.evaluate(bound, memo)
            if isinstance(a, (list, tuple)):
                return type(a)(ev(v) for v in a)
            return a

        args = [ev(a) for a in self.args]
        kwargs = {k: ev(v) for k, v in self.kwargs.items()}
        if self.inplace:
            args[0] = args[0].clone()
            self.func(*args, **kwargs)
            out = args[0]
        else:
            out = self.func(*args, **kwargs)
            if isinstance(out, (tuple, list)):
                out = out[self.index]
        memo[key] = out
        return out


# id(tensor) -> how its known value was computed from host copies (see Note [Read programs]); absent for constants
_exprs: dict[int, HostExpr] = {}


def known_expr(t: torch.Tensor) -> HostExpr | None:
    """Return how `t`'s known value was computed from host copies (None: unknown, a constant or a default)."""
    return _exprs.get(id(t)) if _known_record(t) is not None else None


def _operand(a: Any) -> Any:
    """Return `a` as an operand of a HostExpr: a known tensor's expression (or its value when it is a constant)."""
    if isinstance(a, EmuTensor):
        e = _exprs.get(id(a))
        if e is not None:
            return e
        rec = _known_record(a)
        return rec[0] if rec is not None else None
    if isinstance(a, (list, tuple)) and a and not isinstance(a[0], (int, float)):
        return type(a)(_operand(v) for v in a)
    if isinstance(a, torch.device) and a.type == "cuda":
        return torch.device("cpu")
    return a


# id(tensor) -> ids of the host copies its known value was computed from (see set_known_value)
_sources: dict[int, frozenset[int]] = {}


def known_sources(t: torch.Tensor) -> frozenset[int]:
    """Return the host copies `t`'s known value derives from (empty when it has none or is a constant)."""
    return _sources.get(id(t), frozenset()) if _known_record(t) is not None else frozenset()


# Set by the replay recorder while it records a forward: read_sink(nbytes, reason, sources, expr, value) sees every
# device-to-host read, with the host copies a known value read derives from (empty: a constant or a default answer),
# how it was computed from them (Note [Read programs]) and the value read.
# See Note [Replay with host reads] in replay.py.
read_sink: Any = None
# Set with read_sink: copy_sink(nbytes, pinned, non_blocking, out, src) sees every host-to-device copy in a recorded forward
# (Note [Copies in forward] in replay.py).
copy_sink: Any = None


# id(tensor) -> in-place scalar ops applied on the device and not yet to the recorded host value (applied on read);
# See Note [Counters on the device]
_pending: dict[int, list[tuple[Any, list[Any], dict[str, Any]]]] = {}


def _version_of(t: torch.Tensor) -> int:
    """Return `t`'s version counter; -1 for inference tensors, which have none (in-place changes go unseen)."""
    return -1 if t.is_inference() else t._version


def _known_record(t: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    rec = _known.get(id(t)) if _known else None
    if rec is None or rec[0]() is not t:
        return None
    if rec[3] != _version_of(t):  # modified on the device since: the value is no longer known
        _forget(id(t))
        return None
    if _pending and id(t) in _pending:
        return _apply_pending(id(t)), rec[2]
    return rec[1], rec[2]


def _apply_pending(key: int) -> torch.Tensor:
    """Apply the queued in-place ops of tensor `key` to its recorded host value; return the new value."""
    ref, value, default, version = _known[key]
    value = value.clone()
    for func, operands, kwargs in _pending.pop(key, ()):
        func(value, *operands, **kwargs)
    _known[key] = (ref, value, default, version)
    return value


def known_value(t: torch.Tensor) -> torch.Tensor | None:
    """Return the recorded CPU value of `t` (None when there is none or `t` was modified in place since)."""
    rec = _known_record(t)
    return rec[0] if rec is not None else None


# ---- transfers -----------------------------------------------------------------------------------------------


def is_pinned_host(t: torch.Tensor) -> bool:
    """Return True when a CPU tensor counts as pinned (really pinned, or pinned by gpemu)."""
    from gpemu.torch_backend.pinned import is_pinned

    return is_pinned(t)


def host_to_device(src: torch.Tensor, index: int, non_blocking: bool = False, dtype: torch.dtype | None = None) -> EmuTensor:
    """Copy a CPU tensor to emulated device `index` (copy engine; pageable or blocking copies block the host)."""
    if src.is_nested:
        from gpemu.torch_backend.nested import nested_error

        raise nested_error("a nested tensor moved with .cuda() / .to('cuda')")  # Note [Nested tensors]
    if src.layout is torch.sparse_coo:  # nnz-sized indices and values: Note [Sparse matrices on the device]
        from gpemu.torch_backend.sparse import sparse_to_device

        return sparse_to_device(src if dtype is None else src.to(dtype), index, non_blocking)
    pinned = is_pinned_host(src)
    nbytes = _nbytes(src)
    # torch.preserve_format, as `.cuda()` / `.to("cuda")` on a GPU: a dense tensor keeps its strides (a channels_last
    # batch stays channels_last; before session 8 only contiguous ones did), anything else becomes contiguous
    meta = torch.empty_like(src, device=META)
    out = wrap(meta, index, tag="h2d")
    if nbytes == 0:  # torch copies nothing for an empty tensor (transformers' caches start as torch.tensor([]))
        if dtype is not None and dtype != src.dtype:
            return run_op(aten._to_copy.default, (out,), {"dtype": dtype})  # type: ignore[no-any-return]
        set_known_value(out, src.clone())
        return out
    charge_h2d(index, nbytes, pinned, non_blocking)
    if copy_sink is not None:
        copy_sink(nbytes, pinned, non_blocking, out, src)
    if dtype is not None and dtype != src.dtype:
        return run_op(aten._to_copy.default, (out,), {"dtype": dtype})  # type: ignore[no-any-return]
    if nbytes <= KNOWN_VALUE_MAX_BYTES and src.device.type == "cpu":
        set_known_value(out, src.clone())  # a copy: the script may refill its host buffer
    elif nbytes <= RANGE_MAX_BYTES and _integral(src) and src.device.type == "cpu":  # See Note [Value ranges]
        lo, hi = torch.aminmax(src)
        set_value_range(out, int(lo), int(hi))
    return out


def charge_h2d(index: int, nbytes: int, pinned: bool, non_blocking: bool, args: dict[str, Any] | None = None) -> None:
    """Queue a host-to-device copy of `nbytes` on the current stream of device `index`; a pageable or blocking copy
    blocks the host until it is done."""
    emu = state.require()
    device = emu.devices[index]
    bw_gbps = device.spec.h2d_pinned_gbps if pinned else device.spec.h2d_pageable_gbps
    work = emu.current_stream(index).enqueue(
        nbytes / (bw_gbps * 1e9), "memcpy HtoD", "h2d", "h2d", {"bytes": nbytes, "pinned": pinned, **(args or {})}
    )
    device.stats.h2d_bytes += nbytes
    if not (pinned and non_blocking):
        device.host_wait(work.end_s, reason="h2d pageable" if not pinned else "h2d blocking")


def device_to_host(t: EmuTensor, reason: str = "d2h", dtype: torch.dtype | None = None) -> torch.Tensor:
    """Copy an emulated tensor to the host: wait for its stream, charge the copy, return zeros (or hook values)."""
    nbytes = _nbytes(t)
    charge_read(t._index, nbytes, reason)
    rec = _known_record(t)
    if rec is not None and not rec[1]:
        out = rec[0].clone()
    else:
        out = host_value(tuple(t.shape), t.dtype, reason, rec[0] if rec is not None else None)
    if read_sink is not None:
        if rec is not None and not rec[1]:
            read_sink(nbytes, reason, _sources.get(id(t), frozenset()), _exprs.get(id(t)), rec[0])
        else:
            read_sink(nbytes, reason, frozenset(), None, None)
    return out.to(dtype) if dtype is not None else out


def charge_read(index: int, nbytes: int, reason: str, args: dict[str, Any] | None = None) -> None:
    """Queue a D2H copy of `nbytes` on the current stream of device `index` and block the host until it is done."""
    emu = state.require()
    device = emu.devices[index]
    work = emu.current_stream(index).enqueue(
        nbytes / (device.spec.d2h_pinned_gbps * 1e9), "memcpy DtoH", "d2h", "d2h", {"bytes": nbytes, **(args or {})}
    )
    device.stats.d2h_bytes += nbytes
    device.host_wait(work.end_s, reason=reason)


def peer_copy(t: EmuTensor, index: int) -> EmuTensor:
    """Copy an emulated tensor to another emulated device (NVLink when the spec has it, else PCIe)."""
    emu = state.require()
    src = emu.devices[t._index]
    bw_gbps = src.spec.nvlink_gbps or src.spec.h2d_pinned_gbps
    out = wrap(torch.empty(t.shape, dtype=t.dtype, device=META), index, tag="p2p")
    emu.current_stream(t._index).enqueue(_nbytes(t) / (bw_gbps * 1e9), "memcpy PtoP", "d2h", "p2p")
    emu.devices[index].default_stream.wait_stream(emu.current_stream(t._index))
    return out


@_special(aten._to_copy.default)
def _to_copy(func: Any, args: Any, kwargs: Any) -> Any:
    x = args[0]
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if isinstance(x, EmuTensor):
        if device is not None and device.type == "cpu":
            return device_to_host(x, reason="tensor.cpu()", dtype=dtype)
        if device is not None and device.type == "cuda" and device.index is not None and device.index != x._index:
            x = peer_copy(x, device.index)
            if dtype is None or dtype == x.dtype:
                return x
        kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking")}
        out = run_op(func, (x, *args[1:]), kwargs)
        if _known and id(x) in _known and isinstance(out, EmuTensor):  # a cast of a host-known value: labels.float()
            value = known_value(x)
            if value is not None:
                set_known_value(out, value.to(out.dtype), sources=_sources.get(id(x)),
                                expr=HostExpr(torch.Tensor.to, (_operand(x), out.dtype)))
        if _nz_bounds and isinstance(out, EmuTensor) and id(x) in _nz_bounds:  # mask.bool(): Note [Nonzero bounds]
            bound = nonzero_bound(x)
            if bound is not None:
                set_nonzero_bound(out, bound)
        return out
    # a CPU source with an emulated device argument cannot reach here (the CPU kernel handles it)
    return run_op(func, args, kwargs)


# Note [type_as across devices]: `t.type_as(other)` is `t.to(other's dtype and device)`, so a CPU tensor meeting a
# CUDA one moves to the GPU: ultralytics' make_anchors builds `torch.arange(w).type_as(feats[0])`. In autograd mode
# torch decomposes it into `to(other.options())`, whose device is the wrapper's C++ `meta`: the result was a plain
# meta tensor, not an emulated one, with no copy charged. Under inference mode (ultralytics' validation,
# torchvision's evaluate) `aten.type_as` reaches gpemu whole, and the device check (Note [Tensors on two devices])
# raised "Expected all tensors to be on the same device" where a GPU moves the tensor. `Tensor.type_as` is patched
# to `self.to(other)` when either side is emulated (patches.py), and the aten op is handled as the copy it is.
@_special(aten.type_as.default)
def _type_as(func: Any, args: Any, kwargs: Any) -> Any:
    x, other = args[0], args[1]
    if isinstance(x, EmuTensor) and isinstance(other, EmuTensor):
        if x.dtype == other.dtype and x._index == other._index:
            return x
        return _to_copy(aten._to_copy.default, (x,), {"dtype": other.dtype, "device": other.device})
    if isinstance(other, EmuTensor):  # a CPU tensor: copied to the device, then cast
        return host_to_device(x, other._index, dtype=other.dtype)
    # an emulated tensor meeting a CPU one: read back to the host
    return device_to_host(x, reason="tensor.type_as()", dtype=None if x.dtype == other.dtype else other.dtype)


# Note [Plain meta tensors in copies]: C++ code that allocates with an emulated tensor's options gets plain meta
# tensors (DDP's Reducer buckets: Note [DDP on one rank] in gpemu/distributed/ddp.py). Such a tensor stands for
# memory on the emulated tensor's device, so a copy between the two is a device-to-device copy priced like any
# copy_, not a host transfer (which would also make the host wait on every bucket).
@_special(aten.copy_.default)
def _copy_(func: Any, args: Any, kwargs: Any) -> Any:
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    if isinstance(dst, EmuTensor) and isinstance(src, EmuTensor):
        if src._index != dst._index:
            src = peer_copy(src, dst._index)
        return run_op(func, (dst, src), {})
    if dst.device.type == "meta" or src.device.type == "meta":  # Note [Plain meta tensors in copies]
        emu_side = dst if isinstance(dst, EmuTensor) else src
        meta_dst = dst._elem if isinstance(dst, EmuTensor) else dst
        meta_src = src._elem if isinstance(src, EmuTensor) else src
        index = emu_side._index
        charge(index, func, op_cost_s(func, (meta_dst, meta_src), {}, meta_dst, index))
        return dst
    if isinstance(dst, EmuTensor):  # host -> device into an existing tensor
        if src.dim() == 0 and src.device.type == "cpu":
            out = run_op(aten.fill_.Tensor, (dst, src), {})
            if _known_values_enabled((dst,)):  # `ptr[0] = n`: See Note [Writes through views]
                propagate_known(aten.fill_.Tensor, (dst, src), {}, out)
            return out
        tmp = host_to_device(src, dst._index, non_blocking)
        return run_op(func, (dst, tmp), {})
    # device -> host into an existing CPU tensor
    if not _zeros_into_host(dst, src):
        dst.copy_(device_to_host(src, reason="copy_ to host"))
    return dst


# Note [D2H into a host buffer]
# `host_buf.copy_(gpu_tensor)` of a computed tensor made the zeros in a fresh host tensor and then copied them into
# host_buf: two passes over host memory on the emulating machine, where a GPU's copy engine writes the buffer with
# no CPU work. On an H200 (bench/data/h200-2026-11-27, micro.csv) a 256 MiB D2H into pinned memory took 4.9 ms (55
# GB/s); emulated on a 2-core host the same loop took 78 ms (3.4 GB/s): the host passes, not the priced 5.4 ms copy.
# Now such a copy writes zeros straight into host_buf (one pass), and not at all when this function zeroed that very
# tensor last and nothing wrote it since (its storage and version counter unchanged): a loop that offloads into a
# preallocated buffer pays the pass once. Values a hook or a known host copy supply still take the old path.
_zeroed_host: dict[int, tuple[int, int, int]] = {}  # TensorImpl address -> (data_ptr, bytes, version)


def _zeros_into_host(dst: torch.Tensor, src: EmuTensor) -> bool:
    """Copy computed `src` into host `dst` as zeros in place (Note [D2H into a host buffer]); False when `src` has
    values to deliver or the copy needs a conversion (the caller then copies through device_to_host)."""
    emu = state.current_emulation()
    if (_known_record(src) is not None or _read_answers or emu is None or emu.value_hook is not None
            or (emu.float_value and src.dtype.is_floating_point) or dst.dtype != src.dtype or dst.shape != src.shape):
        return False
    nbytes = _nbytes(src)
    charge_read(src._index, nbytes, "copy_ to host")
    if read_sink is not None:
        read_sink(nbytes, "copy_ to host", frozenset(), None, None)
    key = dst._cdata  # the TensorImpl: dispatch hands the same tensor over in a new Python object each call
    try:
        version = dst._version
    except RuntimeError:  # an inference tensor keeps no version counter: write every time
        dst.zero_()
        return True
    if _zeroed_host.get(key) != (dst.data_ptr(), nbytes, version):
        dst.zero_()  # below autograd's in-place key: no bump here
    if len(_zeroed_host) > 1024:
        _zeroed_host.clear()
    # the copy_ this runs inside bumps the counter once on its way out
    _zeroed_host[key] = (dst.data_ptr(), nbytes, version + 1)
    return True


@_special(aten._local_scalar_dense.default, aten.item.default)  # item: inference tensors reach dispatch with it
def _item(func: Any, args: Any, kwargs: Any) -> Any:
    t = args[0]
    return device_to_host(t, reason="tensor.item()").reshape(()).item()


@_special(aten.equal.default)
def _equal(func: Any, args: Any, kwargs: Any) -> Any:
    known = [known_value(t) if isinstance(t, EmuTensor) else t for t in args[:2]]
    values = [device_to_host(t, reason="torch.equal") if isinstance(t, EmuTensor) else t for t in args[:2]]
    if known[0] is not None and known[1] is not None:  # both computed from host-known values: the real answer
        return bool(torch.equal(known[0], known[1]))
    if args[0].dtype == torch.bool and args[0].numel() == 1 and args[0].shape == args[1].shape:
        # torch's C++ checks `is_scalar_tensor_true(cond)` = equal(cond, cond.new_ones(())): a check result reads
        # False like any bool read, so the check passes (istft's window-envelope check)
        return bool(torch.equal(values[0], values[1]))
    return args[0].shape == args[1].shape


# Note [Equal on internal meta tensors]
# An emulated tensor's C++ device is meta (Note [Why the wrapper lives on meta] in tensor.py), so a C++ composite op
# that builds a helper tensor from `self.options()` builds a plain meta tensor that never reaches gpemu's dispatch.
# torch.cov does: `num_observations = at::scalar_tensor(n, observations.options())`, then
# `TORCH_WARN_IF(is_scalar_tensor_true(at::le(norm_factor, 0)), ...)`, where is_scalar_tensor_true is
# `at::equal(t, t.new_ones({}))` and meta has no `equal` kernel: torch.cov of any emulated tensor raised
# NotImplementedError (hlb-CIFAR10's main.py whitens its first conv with `torch.cov(patches)`; on a GPU the check reads
# False for any valid input and cov returns). While gpemu is installed, aten::equal gets a Meta kernel answering as
# `_equal` does for values it does not know: a 0-dim bool against its ones reads False (a C++ sanity check on it does
# not fire), otherwise "equal" when the shapes match.
_meta_equal_lib: Any = None


def _meta_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.bool and a.numel() == 1 and a.shape == b.shape:
        return False
    return a.shape == b.shape


def install_meta_equal() -> Callable[[], None]:
    """Register the Meta kernel of Note [Equal on internal meta tensors]; return the function that removes it."""
    global _meta_equal_lib
    if _meta_equal_lib is not None:  # already installed (a nested install): the outer one removes it
        return lambda: None
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("equal", _meta_equal, "Meta")
    _meta_equal_lib = lib

    def remove() -> None:
        global _meta_equal_lib
        lib._destroy()
        _meta_equal_lib = None

    return remove


@_special(aten.new_ones.default)
def _new_ones(func: Any, args: Any, kwargs: Any) -> Any:
    """new_ones: a tensor of at most 16 ones keeps that host value (as torch.full does)."""
    out = _tensor_mod.run_op(func, args, kwargs)
    if isinstance(out, EmuTensor) and out.numel() <= 16:
        set_known_value(out, torch.ones(tuple(out.shape), dtype=out.dtype))
    return out


@_special(aten._cudnn_rnn_flatten_weight.default)
def _rnn_flatten_weight(func: Any, args: Any, kwargs: Any) -> Any:
    """RNN.flatten_parameters(): one copy of every weight into a flat buffer (Note [RNN weight flattening])."""
    weights = [w for w in args[0] if isinstance(w, EmuTensor)]
    numel = sum(w.numel() for w in weights)
    flat = torch.empty((numel,), dtype=weights[0].dtype, device=META)
    charge(weights[0]._index, func, op_cost_s(aten.clone.default, (flat,), {}, flat, weights[0]._index))
    return wrap(flat, weights[0]._index, tag="cudnn_rnn_flatten_weight")


# Note [RNN weight flattening]: nn.LSTM/GRU call torch._cudnn_rnn_flatten_weight when their weights do not alias
# (distinct data_ptr()s; with every emulated address 0 they all "aliased" and the call was skipped). cuDNN copies the
# weights into one buffer and re-points them into it; gpemu charges the copy and returns the buffer (the script
# drops it), leaving the weights as they are: the same bytes either way, one transient buffer more.


@_special(aten.is_pinned.default)
def _is_pinned(func: Any, args: Any, kwargs: Any) -> Any:
    return False


@_special(aten.record_stream.default)
def _record_stream(func: Any, args: Any, kwargs: Any) -> Any:
    return None


# ---- data-dependent shapes -----------------------------------------------------------------------------------

# Note [Data-dependent shapes]: ops whose output size depends on values (nonzero, masked_select, boolean-mask
# indexing) cannot be shaped from metadata. gpemu assumes a fraction `nonzero_fraction` (default 1.0: the worst case,
# so memory is never under-estimated) of the elements are selected; set it with install(nonzero_fraction=...) or
# GPEMU_NONZERO_FRACTION. A real GPU also synchronises the host for these ops (the size must reach the host), so
# they wait for the stream. `unique` and friends answer on read values instead (Note [Unique on read values]).


def _selected(numel: int, mask: Any = None) -> int:
    emu = state.require()
    k = min(numel, math.ceil(numel * emu.nonzero_fraction))
    bound = nonzero_bound(mask) if mask is not None else None
    return k if bound is None else min(k, bound)


# Note [Nonzero bounds]: a mask built by scattering k indices into zeros has at most k nonzero elements, whatever
# the indices' values. Detection models sample this way: torchvision's BalancedPositiveNegativeSampler writes 128
# positive and 384 negative indices into `zeros_like` masks of the 2,000 proposals (RPN: of the ~200k anchors) and
# selects `torch.where(pos | neg)[0]`; Mask R-CNN's mask head then runs on the positives. With the worst-case
# `nonzero_fraction` every proposal was selected: 2,002 sampled RoIs per image where a GPU runs 512, and the box and
# mask heads priced on 4,004 RoIs (Mask R-CNN on an A100 charged ~220 ms per batch-2 step). So gpemu keeps an upper
# bound on the nonzero count of such masks: 0 after `zeros`/`zeros_like`/`new_zeros`/`zero_` (and the count of a
# known value), plus k elements (k rows) after `index_put` with one long index of length k, the sum over `|` and
# `cat`, the smaller one over `&`, kept through `clone`/`to`; nonzero, masked_select and boolean indexing select at
# most the bound. Like known values the bound is tied to the tensor's version: another in-place op forgets it.
# Mixture-of-experts routers build their gates the same way: davidmrau's noisy top-k gating is
# `zeros_like(logits).scatter(1, top_k_indices, top_k_gates)`, k of each row's E experts, and the dispatcher selects
# `nonzero(gates)` and the mask `gates > 0`. A scatter without a reduction adds at most its index's element count to
# the bound, and `x > t` (t >= 0) or `x >= t` (t > 0) keeps x's bound: zeros fail it. Batch 5, k = 4 of 10 experts
# routes 20 token-expert pairs as on a GPU, not the worst case's 50.

# Facts about an emulated tensor's values (nonzero bounds, softmax mass, value ranges) live in registries keyed by
# id: (weakref to the tensor, the fact, its version at recording). A fact dies with the tensor and is forgotten once
# an in-place op moves the version (`bumps`: version changes the recording op itself will still make).
_Facts = dict[int, tuple[weakref.ref[EmuTensor], Any, int]]


def _remember(registry: _Facts, t: EmuTensor, fact: Any, bumps: int = 0) -> None:
    """Store `fact` about `t` in `registry` until `t` dies or changes in place."""
    key = id(t)
    version = _version_of(t)
    registry[key] = (weakref.ref(t, lambda _ref, key=key: registry.pop(key, None)),  # type: ignore[misc]
                     fact, version + bumps if version >= 0 else version)


def _recall(registry: _Facts, t: torch.Tensor) -> Any:
    """Return the fact `registry` holds about `t` itself, or None (none, or `t` changed since: forgotten)."""
    entry = registry.get(id(t))
    if entry is None or entry[0]() is not t:
        return None
    if entry[2] != _version_of(t):
        registry.pop(id(t), None)
        return None
    return entry[1]


# id(emulated tensor) -> (weakref to it, at most this many nonzero elements, its version at recording)
_nz_bounds: _Facts = {}


def set_nonzero_bound(t: EmuTensor, bound: int, bumps: int = 0) -> None:
    """Record that `t` has at most `bound` nonzero elements until it is modified in place (Note [Nonzero bounds])."""
    _remember(_nz_bounds, t, min(bound, t.numel()), bumps)


def nonzero_bound(t: Any) -> int | None:
    """Return an upper bound on the nonzero elements of emulated tensor `t`, or None (Note [Nonzero bounds])."""
    if not isinstance(t, EmuTensor):
        return None
    if _known and id(t) in _known:
        rec = _known_record(t)
        if rec is not None and not rec[1]:
            return int(torch.count_nonzero(rec[0]))
    bound: int | None = _recall(_nz_bounds, t)
    return bound


def _sum_of(ts: Any, bound: Callable[[Any], Any]) -> Any:
    """Return the sum of `bound(t)` over `ts` (nonzero_bound, mass_bound), or None when one of them has none."""
    total = 0
    for t in ts:
        b = bound(t)
        if b is None:
            return None
        total += b
    return total


def _bound_sum(ts: Any) -> int | None:
    """Return the sum of the nonzero bounds of `ts`, or None when one of them has none."""
    return _sum_of(ts, nonzero_bound)  # type: ignore[no-any-return]


def _zeros(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if isinstance(out, EmuTensor):
        set_nonzero_bound(out, 0)
        if _integral(out) and out.numel():  # Note [Value ranges]
            set_value_range(out, 0, 0)
        if _known_values_enabled(args):
            propagate_known(func, args, kwargs, out)
    return out


def _known_values_enabled(args: Any) -> bool:
    a0 = args[0] if args else None
    return bool(_known) and (type(a0) is not EmuTensor or id(a0) in _known)


def _keep_bound(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    listed = func is aten.cat.default or func is aten.stack.default
    if _nz_bounds and isinstance(out, EmuTensor) and out is not args[0]:
        bound = _bound_sum(args[0]) if listed else nonzero_bound(args[0])
        if bound is not None:
            set_nonzero_bound(out, bound)
    if _mass and isinstance(out, EmuTensor) and out is not args[0]:  # Note [Softmax mass]
        mass = _mass_sum(args[0]) if listed else mass_bound(args[0])
        if mass is not None:
            set_mass(out, mass)
    if _ranges or _known:  # Note [Value ranges]
        carry_range(out, args[0] if listed else (args[0],))
    return out


# Note [Softmax mass]: a softmax output's rows each sum to 1, so its elements (all >= 0) sum to its row count R,
# and so does any part of it; at most floor(R / t) of them can exceed t > 0, whatever the logits. Detection models
# threshold class scores this way: torchvision's RoIHeads.postprocess_detections takes `softmax(class_logits)`,
# drops the background column, flattens it and keeps `torch.where(scores > box_score_thresh)` (0.05). With the
# worst-case `nonzero_fraction` every one of the 1,000 proposals x 90 classes passed: batched_nms then ran one NMS
# over 90,000 boxes, priced as a pass over its 90,000^2 IoU pairs (45 ms of a Faster R-CNN evaluation image's 52.6 ms
# on an A100). At most 1,000 / 0.05 = 20,000 can pass. gpemu keeps an upper bound on the sum (the "mass") of
# softmax outputs through views (by their base), `clone`, `_unsafe_view` (a non-contiguous `reshape`) and `cat`
# (the sum), and a `>`/`>=` comparison with a positive number gets the nonzero bound floor(mass / t) (Note [Nonzero
# bounds]). A part keeps the whole's mass (a batch-2 evaluation's per-image split of 2 x 1,000 rows is bounded by
# 2,000 / 0.05 = 40,000 per image: looser, still a bound); `expand` repeats elements and keeps none. Like nonzero
# bounds the mass is tied to the tensor's version: an in-place op forgets it.

# id(emulated tensor) -> (weakref to it, an upper bound on the sum of its elements (all >= 0), its version)
_mass: _Facts = {}


def set_mass(t: EmuTensor, mass: float) -> None:
    """Record that `t`'s elements are >= 0 and sum to at most `mass` until it changes (Note [Softmax mass])."""
    _remember(_mass, t, mass)


def mass_bound(t: Any) -> float | None:
    """Return an upper bound on the sum of `t`'s (non-negative) elements, or None (Note [Softmax mass])."""
    if not isinstance(t, EmuTensor):
        return None
    base: torch.Tensor | None = t._base
    for src in (t,) if base is None else (t, base):  # a view holds a subset of its base's elements, when it repeats
        entry = _mass.get(id(src))  # none (not `expand`)
        if entry is None or entry[0]() is not src:
            continue
        if src is not t and not _no_overlap(t):
            return None
        mass: float | None = _recall(_mass, src)  # None once changed in place (an inference tensor's changes go
        return mass  # unseen, as for bounds)
    return None


def _no_overlap(t: torch.Tensor) -> bool:
    """Return True when no two indices of `t` address the same element (sufficient test on sizes and strides)."""
    extent = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1):
        if stride <= extent:
            return False
        extent += (size - 1) * stride
    return True


def _mass_sum(ts: Any) -> float | None:
    """Return the sum of the mass bounds of `ts`, or None when one of them has none."""
    total = _sum_of(ts, mass_bound)
    return None if total is None else float(total)


@_special(aten._softmax.default, aten.softmax.int)  # softmax.int reaches dispatch undecomposed in some runs
def _softmax(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    x, dim = args[0], args[1]
    if isinstance(out, EmuTensor) and out.numel():
        set_mass(out, out.numel() / (x.shape[dim] if x.dim() else 1))
    return out


def _subset(func: Any, args: Any, kwargs: Any) -> Any:
    """An op whose outputs hold (some of) its input's elements, each once: they keep its mass bound
    (Note [Softmax mass])."""
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    if _mass:
        mass = mass_bound(args[0])
        if mass is not None:
            for o in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(o, EmuTensor) and _no_overlap(o):
                    set_mass(o, mass)
    return out


# a non-contiguous reshape's copy (`_unsafe_view` of a clone), and the views that reach dispatch as ops under
# inference mode (autograd-mode views keep their base, which mass_bound reads)
for _op in (aten._unsafe_view.default, aten.slice.Tensor, aten.split_with_sizes.default, aten.split.Tensor,
            aten.select.int, aten.reshape.default, aten.view.default, aten.flatten.using_ints, aten.alias.default,
            aten.detach.default, aten.contiguous.default, aten.narrow.default):
    SPECIAL[_op] = _subset


@_special(aten.gt.Scalar, aten.ge.Scalar)
def _compare_scalar(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    threshold = args[1]
    if _mass and isinstance(out, EmuTensor) and isinstance(threshold, (int, float)) and threshold > 0:
        mass = mass_bound(args[0])
        if mass is not None:
            set_nonzero_bound(out, math.floor(mass / threshold))
    if _nz_bounds and isinstance(out, EmuTensor) and _zero_fails(func, threshold):  # See Note [Nonzero bounds]
        bound, prior = nonzero_bound(args[0]), nonzero_bound(out)
        if bound is not None:
            set_nonzero_bound(out, bound if prior is None else min(bound, prior))
    return out


def _zero_fails(func: Any, threshold: Any) -> bool:
    """Return True when `0 > threshold` (gt) / `0 >= threshold` (ge) is False: only nonzero elements can pass, so
    `gates > 0` keeps the nonzero bound of `gates` (Note [Nonzero bounds])."""
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        return False
    return threshold >= 0 if func is aten.gt.Scalar else threshold > 0


SPECIAL[aten.zeros_like.default] = _zeros
SPECIAL[aten.new_zeros.default] = _zeros
for _op in (aten.cat.default, aten.stack.default, aten.clone.default):
    SPECIAL[_op] = _keep_bound


def _sync(index: int, reason: str) -> None:
    emu = state.require()
    stream = emu.current_stream(index)
    emu.devices[index].host_wait(stream.t_done, reason=reason)


@_special(aten.nonzero.default)
def _nonzero(func: Any, args: Any, kwargs: Any) -> Any:
    x = args[0]
    meta = torch.empty((_selected(x.numel(), x), x.dim()), dtype=torch.long, device=META)
    charge(x._index, func, op_cost_s(aten.abs.default, (to_meta(x),), {}, meta, x._index))
    _sync(x._index, "nonzero (data-dependent size)")
    return wrap(meta, x._index, tag="nonzero")


@_special(aten.masked_select.default)
def _masked_select(func: Any, args: Any, kwargs: Any) -> Any:
    x, mask = args[0], args[1]
    n = torch.broadcast_shapes(x.shape, mask.shape).numel()
    index = x._index if isinstance(x, EmuTensor) else mask._index
    meta = torch.empty((_selected(n, mask if mask.numel() == n else None),), dtype=x.dtype, device=META)
    charge(index, func, op_cost_s(aten.abs.default, (to_meta(x),), {}, meta, index))
    _sync(index, "masked_select (data-dependent size)")
    return wrap(meta, index, tag="masked_select")


def _bool_index(func: Any, args: Any, kwargs: Any) -> Any:
    x, indices = args[0], list(args[1])
    if not any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
        if func is aten.index.Tensor:
            out = run_op(func, args, kwargs)
            if _ranges or _known:  # Note [Value ranges]
                carry_range(out, (x,))
            return out
        return _index_put_bound(func, args, kwargs)
    # replace each boolean mask by long indices of the assumed count (as torch does via nonzero)
    new: list[Any] = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
            k = _selected(i.numel(), i)
            new.extend(torch.empty((k,), dtype=torch.long, device=META) for _ in range(i.dim()))
        else:
            new.append(i)
    index = x._index if isinstance(x, EmuTensor) else state.require().current_device()
    _sync(index, "boolean-mask indexing (data-dependent size)")
    if func is aten.index.Tensor:
        out = run_op(func, (x, new), kwargs)
        if _ranges or _known:  # Note [Value ranges]
            carry_range(out, (x,))
        return out
    return _put_range(x, args[2], run_op(func, (x, new, *args[2:]), kwargs), args, kwargs)


def _index_put_bound(func: Any, args: Any, kwargs: Any) -> Any:
    """index_put with integer indices; a mask with a nonzero bound gains at most the rows written
    (Note [Nonzero bounds])."""
    x, indices = args[0], args[1]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    bound = nonzero_bound(x) if _nz_bounds or _known else None
    out = _put_range(x, args[2], run_op(func, args, kwargs), args, kwargs)
    if bound is None or accumulate or len(indices) != 1 or not isinstance(indices[0], torch.Tensor) or x.dim() == 0:
        return out
    values = args[2]
    written = nonzero_bound(values)
    if written is None:
        written = indices[0].numel() * (x.numel() // x.shape[0])
    if isinstance(out, EmuTensor):  # in place: torch bumps the version after this (and x's known value goes stale)
        set_nonzero_bound(out, bound + written, bumps=1 if out is x else 0)
    return out


SPECIAL[aten.index.Tensor] = _bool_index
SPECIAL[aten.index_put_.default] = _bool_index
SPECIAL[aten.index_put.default] = _bool_index


# Note [Value ranges]: graph libraries size their outputs by reading an index's largest value: PyTorch Geometric's
# `scatter(src, index)` and global pooling take `int(index.max()) + 1` rows, `maybe_num_nodes(edge_index)` the same. A
# computed index read 0, so after TopKPooling (`batch = batch[perm]`, perm computed) `global_max_pool` pooled one graph
# where the batch had 60, and examples/proteins_topk_pool.py died in nll_loss ("Expected input batch_size (1) to match
# target batch_size (60)"). gpemu keeps a range [lo, hi] of the values of integer tensors: a host copy's own min and max
# (of any copy up to RANGE_MAX_BYTES; smaller ones are known outright), kept by ops that only move or pick elements
# (indexing by integer or boolean indices, index_select, gather, sort's values, clone, cat and stack: the union; views
# by their base), with [0, n - 1] for sort's indices and `arange(n)` of any size, [v, v] for `new_full(..., v)` and
# integer zeros, and the union with the written values for a non-accumulating index_put or scatter (only the written
# ones where a 1-D scatter's index covers every position: PyG's pooled batch is `arange(k).scatter_(0, cluster_index,
# batch[perm])` with cluster_index = `arange(k)`; an index gpemu does not know covers when its k elements span [0,
# k-1]). A full max()/min() of a tensor gpemu only has a range for reads the range's end: what a GPU reads when the
# selection spans the values, as pooling's does (TopKPooling keeps ceil(ratio * n) >= 1 nodes of every graph), and the
# worst case that Note [Data-dependent shapes] assumes (every element selected). It is a default answer (Note [Sanity
# checks read back as passing]): the value hook answers first. Like nonzero bounds, a range is tied to the tensor's
# version: another in-place op forgets it.

RANGE_MAX_BYTES = 16 << 20  # the host takes one min/max pass over an integer copy up to this size (~2 M int64)

# id(emulated tensor) -> (weakref to it, (smallest value, largest value), its version at recording)
_ranges: _Facts = {}
# reductions answered from a range so far: the replay path keys a forward that made one by its inputs' ranges
# (Note [Ranges through replay] in replay.py)
range_answers: list[int] = [0]


def _integral(t: torch.Tensor) -> bool:
    """Return True for integer dtypes (not bool): the tensors that index."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def set_value_range(t: EmuTensor, lo: int, hi: int, bumps: int = 0) -> None:
    """Record that `t`'s values lie in [lo, hi] until it is modified in place (Note [Value ranges])."""
    _remember(_ranges, t, (lo, hi), bumps)


def _own_range(t: torch.Tensor) -> tuple[int, int] | None:
    """Return the range of `t` itself (its known value's or a recorded one), or None."""
    rec = _known_record(t) if _known else None
    if rec is not None and not rec[1]:
        v = rec[0]
        if not v.numel() or not _integral(v):
            return None
        lo, hi = torch.aminmax(v)
        return int(lo), int(hi)
    lo_hi: tuple[int, int] | None = _recall(_ranges, t)
    return lo_hi


def value_range(t: Any) -> tuple[int, int] | None:
    """Return (lo, hi) bounding the values of integer emulated tensor `t` (a view by its base's), or None."""
    if not isinstance(t, EmuTensor) or not _integral(t):
        return None
    r = _own_range(t)
    base = t._base
    return r if r is not None or base is None else _own_range(base)


def carry_range(out: Any, sources: Any, bumps: int = 0) -> None:
    """Give integer `out` the union of the ranges of `sources` when each has one (Note [Value ranges])."""
    if not isinstance(out, EmuTensor) or not _integral(out) or not out.numel():
        return
    if _known and id(out) in _known and not bumps and _known_record(out) is not None:  # in place: stale after it
        return
    lo = hi = None
    for s in sources:
        r = value_range(s)
        if r is None:
            return
        lo = r[0] if lo is None else min(lo, r[0])
        hi = r[1] if hi is None else max(hi, r[1])
    if lo is not None and hi is not None:
        set_value_range(out, lo, hi, bumps)


def _gathered(func: Any, args: Any, kwargs: Any) -> Any:
    """An op whose output elements are elements of its first input (index_select, gather)."""
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    if _ranges or _known:
        carry_range(out, (args[0],))
    return out


def _put_range(x: Any, values: Any, out: Any, args: Any, kwargs: Any) -> Any:
    """After index_put: a non-accumulating write leaves `x`'s values or the written ones (Note [Value ranges])."""
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if (_ranges or _known) and not accumulate and isinstance(values, torch.Tensor):
        carry_range(out, (x, values), bumps=1 if out is x else 0)
    return out


@_special(aten.sort.default, aten.sort.stable)
def _sort(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    if _ranges or _known:
        x = args[0]
        dim = kwargs.get("dim", -1) if func is aten.sort.stable else (args[1] if len(args) > 1 else -1)
        carry_range(out[0], (x,))
        n = x.shape[dim] if x.dim() else 1
        if n and isinstance(out[1], EmuTensor) and id(out[1]) not in _known:
            set_value_range(out[1], 0, n - 1)
    return out


def _covers(index: torch.Tensor, n: int) -> bool:
    """Return True when 1-D `index` writes every position 0..n-1 (a known value: exactly; else its n elements span
    [0, n - 1], as `arange(n)` of any size does: Note [Value ranges])."""
    value = known_value(index) if _known else None
    if value is not None:
        return bool(torch.zeros(n, dtype=torch.bool, device="cpu").index_fill_(0, value.reshape(-1), True).all())
    return index.numel() == n and value_range(index) == (0, n - 1)


@_special(aten.scatter_.src, aten.scatter.src, aten.scatter_.value, aten.scatter.value)
def _scatter_src(func: Any, args: Any, kwargs: Any) -> Any:
    """scatter without a reduction: keeps ranges (Note [Value ranges]) and nonzero bounds (Note [Nonzero bounds])."""
    x, index, src = args[0], args[2], args[3]
    bound = nonzero_bound(x) if _nz_bounds or _known else None
    out = run_op(func, args, kwargs)
    if _ranges or _known:  # Note [Value ranges]: a write to every position leaves only `src`'s values; before
        whole = x.dim() == 1 and index.dim() == 1 and _covers(index, x.shape[0])  # an in-place known value moves on
        carry_range(out, (src,) if whole else (x, src), bumps=1 if out is x else 0)
    if bound is not None and isinstance(out, EmuTensor):  # Note [Nonzero bounds]: one element per index at most
        set_nonzero_bound(out, bound + index.numel(), bumps=1 if out is x else 0)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    return out


@_special(aten.new_full.default)
def _new_full(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args):
        propagate_known(func, args, kwargs, out)
    fill = args[2]  # PyG's filter_adj: `node_index.new_full((num_nodes,), -1)`, then the kept nodes' new indices
    if isinstance(out, EmuTensor) and _integral(out) and out.numel() and isinstance(fill, (int, bool)):
        set_value_range(out, int(fill), int(fill))
    return out


SPECIAL[aten.index_select.default] = _gathered
SPECIAL[aten.gather.default] = _gathered


# Note [Sanity checks read back as passing]: values are not computed, so a check like
# `if not torch.isfinite(loss).all()` or torch.distributions' argument validation (`constraint.check(x).all()`) would
# read zeros (False) and fail. gpemu answers the host read of an all() result with True and of an any() result with
# False (everything valid, nothing flagged), unless the value hook answers.


# Note [Absorbing operands]: `known | unknown` is known when the known side is all True, and `known & unknown` when it
# is all False, whatever the unknown side holds. Hugging Face's generate() stops on
# `unfinished_sequences.max() == 0`, with `unfinished &= ~(max_length_reached | eos_seen)`: the EOS check reads the
# generated tokens, which gpemu does not compute, so the whole chain was unknown, the read returned False every step,
# and generation never stopped (a hang). With the max-length flag known, the chain stays known and generation stops
# at max_new_tokens (EOS is never seen: token values are not computed).
def _absorb(func: Any, args: Any, out: EmuTensor, fill: bool) -> None:
    for a in args[:2]:
        rec = _known_record(a) if type(a) is EmuTensor and not a.requires_grad else None
        if rec is None or rec[1] or not rec[0].numel():
            continue
        value = rec[0]
        if bool(value.all()) if fill else not bool(value.any()):
            if torch.broadcast_shapes(tuple(value.shape), tuple(out.shape)) != tuple(out.shape):
                continue
            shape, dtype = tuple(out.shape), out.dtype
            set_known_value(out, torch.full(shape, fill, dtype=dtype), sources=_sources.get(id(a)),
                            expr=HostExpr(_absorbed, (_operand(a), shape, dtype, fill)))
            return


def _absorbed(value: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, fill: bool) -> torch.Tensor:
    """Recompute an absorbed result (Note [Read programs]); raise when the operand no longer decides it."""
    if not (bool(value.all()) if fill else not bool(value.any())):
        raise ValueError("the known operand no longer decides the result")
    return torch.full(shape, fill, dtype=dtype)


def _or_and(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    is_or = func.overloadpacket in (aten.bitwise_or, aten.logical_or)
    if isinstance(out, EmuTensor) and out.numel() * out.element_size() <= KNOWN_VALUE_MAX_BYTES and not (
            propagate_known(func, args, kwargs, out)):
        _absorb(func, args, out, is_or)
    if isinstance(out, EmuTensor) and id(out) not in _known and (_nz_bounds or _known):  # Note [Nonzero bounds]
        if is_or:
            bound = _bound_sum(args[:2])
        else:
            bounds = [b for b in (nonzero_bound(a) for a in args[:2]) if b is not None]
            bound = min(bounds) if bounds else None
        if bound is not None and all(isinstance(a, EmuTensor) and a.shape == out.shape for a in args[:2]):
            set_nonzero_bound(out, bound)
    return out


for _op in (aten.bitwise_or.Tensor, aten.logical_or.default, aten.bitwise_and.Tensor, aten.logical_and.default):
    SPECIAL[_op] = _or_and


def _all_any(func: Any, args: Any, kwargs: Any) -> Any:
    out = run_op(func, args, kwargs)
    if isinstance(out, EmuTensor) and propagate_known(func, args, kwargs, out):
        return out  # the input's value is known (a mask built from host data): the real answer
    if isinstance(out, EmuTensor):
        fill = func.overloadpacket in (aten.all, aten._is_all_true)
        set_known_value(out, torch.full(tuple(out.shape), fill, dtype=out.dtype, device="cpu"), default=True)
    return out


for _packet in (aten.all, aten.any):
    for _name in ("default", "dim", "dims"):
        if _name in _packet.overloads():
            SPECIAL[getattr(_packet, _name)] = _all_any
SPECIAL[aten._is_all_true.default] = _all_any  # torch.distributions' argument validation
SPECIAL[aten._is_any_true.default] = _all_any


# Note [Finite checks read back as passing]: `isfinite` of a computed tensor read back the default zeros, i.e. False:
# "not finite". ultralytics' trainer checks `not self.loss.isfinite()` after every epoch and warned "Loss NaN/Inf
# detected" (and tries to reload last.pt) on every emulated run. Like all()/any() (Note [Sanity checks read back as
# passing]), a computed value's isfinite reads True (up to 64 KiB of output: larger ones are read through all());
# a host-known value's is computed. isnan/isinf read False already (zeros). torch decomposes isfinite before
# dispatch in autograd mode (`(x == x) * (x.abs() != inf)`), so `torch.isfinite` and `Tensor.isfinite` are
# patched (patches.py) and call this on their result.
def finite_check_passes(out: Any) -> Any:
    """Make `out` (an isfinite result) read True where its value is not known (Note [Finite checks read back as
    passing])."""
    if (isinstance(out, EmuTensor) and (not _known or id(out) not in _known)
            and out.numel() * out.element_size() <= KNOWN_VALUE_MAX_BYTES):
        set_known_value(out, torch.ones(tuple(out.shape), dtype=out.dtype), default=True)
    return out


# Note [Unique on read values]: `torch.unique` and friends size their outputs by the input's values. gpemu answers
# them on the values a host read of the input returns: the known value (labels copied from the host: the real
# answer), else what `.cpu()` would read (zeros, the value hook's or GPEMU_FLOAT_VALUE's answer), so `t.unique()` on
# the device agrees with `t.cpu().unique()` under gpemu. torchmetrics validates every integer-label metric call this
# way (`len(torch.unique(target)) > num_classes` raises; `validate_args=True` is its default): its functional
# `accuracy(logits.argmax(-1), y, task="multiclass", num_classes=10)` died with UnsupportedOpError before (Lightning
# Fabric's build_your_own_trainer example). Outputs up to 64 KiB keep their values (a later read of the counts is
# right), the op is charged as a sort of the input, and the host waits for it: CUDA copies the unique count to the host.
@_special(aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default, aten._unique.default)
def _unique(func: Any, args: Any, kwargs: Any) -> Any:
    x = args[0]
    value = known_value(x) if _known else None
    sources: frozenset[int] = frozenset()
    expr: HostExpr | None = None
    if value is None:  # a default answer (Note [Reading computed values])
        value = host_value(tuple(x.shape), x.dtype, "torch.unique")
    else:
        sources, expr = known_sources(x), HostExpr(func, (_operand(x), *args[1:]), kwargs)
    outs = func(value, *args[1:], **kwargs)
    index = x._index
    charge(index, func, op_cost_s(aten.sort.default, (to_meta(x),), {}, (to_meta(x), to_meta(x)), index))
    _sync(index, "unique (data-dependent size)")
    wrapped = []
    for i, o in enumerate(outs):
        w = wrap(torch.empty(o.shape, dtype=o.dtype, device=META), index, tag="unique")
        if _nbytes(o) <= KNOWN_VALUE_MAX_BYTES:
            set_known_value(w, o, default=expr is None, sources=sources,
                            expr=None if expr is None else HostExpr(func, expr.args, kwargs, index=i))
        wrapped.append(w)
    return tuple(wrapped)


def _inplace_view(func: Any, args: Any, kwargs: Any) -> Any:
    """In-place metadata ops (`unsqueeze_`, `transpose_`, ...): restride the wrapper to its inner meta tensor."""
    w = args[0]
    func(w._elem, *args[1:], **kwargs)  # the inner meta tensor takes the new sizes/strides; no kernel, no memory
    with torch._C._DisableTorchDispatch():  # See Note [In-place view ops]
        aten.as_strided_.default(w, w._elem.shape, w._elem.stride(), w._elem.storage_offset())
    w._mk = (w._elem.shape, w._elem.stride(), w.dtype, w._index)
    return w


# Note [In-place view ops]: `x.unsqueeze_(0)`, `transpose_`, `squeeze_`, `t_`, `as_strided_` change only a tensor's
# sizes and strides. An EmuTensor is a wrapper whose metadata C++ does not update from __torch_dispatch__, so these
# failed ("changed the shape of an emulated tensor in place"; e.g. inside torch.stft and torch.quantile). The inner
# meta tensor runs the op, then the wrapper is restrided to match with as_strided_ (its storage is the same size, so
# the bounds check passes), and its op-cache key `_mk` is refreshed.
for _name in ("unsqueeze_", "transpose_", "t_", "squeeze_", "as_strided_", "swapdims_", "swapaxes_"):
    _view_packet: Any = getattr(aten, _name, None)
    if _view_packet is not None:
        for _ov in _view_packet.overloads():
            SPECIAL[getattr(_view_packet, _ov)] = _inplace_view


def _host_operand(a: Any) -> Any:
    """Return `a` as a host value (numbers and CPU tensors as they are, emulated tensors by their known value)."""
    if isinstance(a, EmuTensor):
        return known_value(a)
    return a


def _counter_inplace(func: Any, args: Any, kwargs: Any) -> Any:
    """Scalar in-place arithmetic: run it on the device; on a tensor whose value is known, update that value too."""
    out = _tensor_mod.run_op(func, args, kwargs)
    t = args[0]
    if func is _ZERO or func is _FILL:
        if func is _ZERO or (isinstance(args[1], (int, float, bool)) and args[1] == 0):
            set_nonzero_bound(t, 0, bumps=1)  # See Note [Nonzero bounds]
        value = args[1] if func is _FILL else 0
        small = t.numel() <= 16 or (value != 0 and t.numel() * t.element_size() <= KNOWN_VALUE_MAX_BYTES)
        if small:  # a reset (or a nonzero fill: Note [Filled labels]): the value is known again
            set_known_value(t, torch.full(tuple(t.shape), value, dtype=t.dtype, device="cpu"), bumps=1)
            if t._base is not None:  # See Note [Writes through views]
                _write_through(t, torch.full(tuple(t.shape), value, dtype=t.dtype, device="cpu"))
        return out
    rec = _known.get(id(t)) if _known else None
    if rec is None or rec[2] or rec[0]() is not t or rec[3] != _version_of(args[0]):  # not known (or stale)
        return out
    operands = [_host_operand(a) for a in args[1:]]  # See Note [Counters on the device]
    if any(o is None for o in operands):
        return out
    pending = _pending.setdefault(id(t), [])
    pending.append((func, operands, kwargs))
    _known[id(t)] = (rec[0], rec[1], rec[2], rec[3] + 1 if rec[3] >= 0 else rec[3])  # torch bumps it after this
    if len(pending) >= 64:  # apply now and then, so a counter never read does not grow a long list
        _apply_pending(id(t))
    return out


_ZERO, _FILL = aten.zero_.default, aten.fill_.Scalar


# Note [Counters on the device]: small tensors whose value gpemu knows (a host copy, a checkpoint, torch.full) are
# often counters updated in place with a number: BatchNorm's num_batches_tracked (`add_(1)`, read back by
# `1.0 / float(self.num_batches_tracked)` when momentum=None, as torch.optim.swa_utils.update_bn sets it), step
# counters. The device op runs as usual and the same op is queued for the host value and applied when it is read
# (cheap per update: resnet50 runs 53 such add_ per step), so the count stays right (it read 0 after the first add_
# and the division failed). `zero_`/`fill_` of a tensor of at most 16 elements (a
# counter reset: BatchNorm.reset_running_stats) makes its value known, as torch.full does.
# Note [Filled labels]: a `fill_` with a nonzero number makes the value known up to KNOWN_VALUE_MAX_BYTES, as
# torch.full does: PyTorch-GAN's `valid = Variable(Tensor(imgs.size(0), 1).fill_(1.0))` labels (64 x 1) read back 0
# (session 16). Zero fills stay bounded at 16 elements: a larger unknown tensor already reads 0, and `zero_` runs on
# every small gradient each step, where a host copy would cost the emulator time for nothing.
for _op in (aten.add_.Tensor, aten.add_.Scalar, aten.sub_.Tensor, aten.sub_.Scalar, aten.mul_.Tensor,
            aten.mul_.Scalar, aten.zero_.default, aten.fill_.Scalar):
    SPECIAL[_op] = _counter_inplace


def _nms(func: Any, args: Any, kwargs: Any) -> Any:
    """torchvision.ops.nms: keep `nonzero_fraction` of the boxes (Note [Data-dependent shapes]); syncs as on CUDA."""
    boxes = args[0]
    n = boxes.shape[0]
    meta = torch.empty((_selected(n),), dtype=torch.long, device=META)
    pairs = torch.empty((n, n), dtype=boxes.dtype, device=META)  # the IoU of every pair of boxes
    charge(boxes._index, func, op_cost_s(aten.abs.default, (pairs,), {}, pairs, boxes._index))
    _sync(boxes._index, "nms (data-dependent size)")  # CUDA nms copies its suppression mask to the host
    return wrap(meta, boxes._index, tag="nms")


def _max_target_len(targets: torch.Tensor, target_lengths: Any) -> int:
    if targets.dim() == 2:  # padded (B, S)
        return int(targets.shape[1])
    if isinstance(target_lengths, EmuTensor):
        target_lengths = known_value(target_lengths)
    if isinstance(target_lengths, torch.Tensor):
        target_lengths = target_lengths.tolist()
    if target_lengths:
        return int(max(target_lengths))
    return int(targets.numel())  # lengths unknown: every target could be the longest


@_special(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def _ctc_loss(func: Any, args: Any, kwargs: Any) -> Any:
    """CTC forward: (neg_log_likelihood [B], log_alpha [B, T, 2 * max target length + 1]), one kernel."""
    log_probs, targets, target_lengths = args[0], args[1], args[3]
    time_steps, batch = int(log_probs.shape[0]), int(log_probs.shape[1])
    states = 2 * _max_target_len(targets, target_lengths) + 1
    nll = torch.empty((batch,), dtype=log_probs.dtype, device=META)
    alpha = torch.empty((batch, time_steps, states), dtype=log_probs.dtype, device=META)
    charge(log_probs._index, func, op_cost_s(aten.exp.default, (alpha,), {}, alpha, log_probs._index))
    return wrap(nll, log_probs._index, tag="ctc_loss"), wrap(alpha, log_probs._index, tag="ctc_loss")


@_special(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward(func: Any, args: Any, kwargs: Any) -> Any:
    """CTC backward: a gradient shaped like log_probs; priced as a pass over alpha/beta and the gradient."""
    log_probs, log_alpha = args[1], args[6]
    grad = torch.empty(tuple(log_probs.shape), dtype=log_probs.dtype, device=META)
    alpha = to_meta(log_alpha)
    cost_s = 2 * op_cost_s(aten.exp.default, (alpha,), {}, alpha, log_probs._index)
    charge(log_probs._index, func, cost_s + op_cost_s(aten.exp.default, (grad,), {}, grad, log_probs._index))
    return wrap(grad, log_probs._index, tag="ctc_loss_backward")


# custom (non-aten) ops whose meta kernels refuse data-dependent outputs, by qualified name
DATA_DEPENDENT_BY_NAME: dict[str, Callable[[Any, Any, Any], Any]] = {"torchvision::nms": _nms}


def data_dependent_op(func: Any, args: Any, kwargs: Any, exc: BaseException) -> Any:
    """Handle an op whose meta kernel failed: a data-dependent op gpemu knows, else a clear error, else `exc`."""
    handler = DATA_DEPENDENT_BY_NAME.get(func.name())
    if handler is not None:
        return handler(func, args, kwargs)
    if "data-dependent" in str(exc) or "data dependent" in str(exc):
        raise UnsupportedOpError(
            f"gpemu cannot emulate op {func}: its output size depends on tensor values, which are not computed. "
            "Workaround: run it on CPU tensors (`.cpu()` before the op, `.cuda()` after)."
        ) from None
    raise exc


def _reduce_known(func: Any, args: Any, kwargs: Any) -> Any:
    """A full reduction (max/min/sum): on a tensor whose value is known, the result's value is known too."""
    out = _tensor_mod.run_op(func, args, kwargs)
    value = known_value(args[0]) if _known and isinstance(args[0], EmuTensor) else None
    if value is not None and isinstance(out, EmuTensor):  # e.g. num_classes = labels.max().item() + 1
        set_known_value(out, func(value, *args[1:], **kwargs), sources=_sources.get(id(args[0])),
                        expr=HostExpr(func, (_operand(args[0]), *args[1:]), kwargs))
    elif (_ranges or _known) and isinstance(out, EmuTensor) and out.dim() == 0 and func in _RANGE_ENDS:
        r = value_range(args[0])  # See Note [Value ranges]
        if r is not None:
            end = r[1] if _RANGE_ENDS[func] else r[0]
            set_known_value(out, torch.tensor(end, dtype=out.dtype, device="cpu"), default=True)
            range_answers[0] += 1
    elif func is aten.sum.default:
        _default_mask_count(args[0], out, func)
    return out


_RANGE_ENDS = {aten.max.default: True, aten.amax.default: True, aten.min.default: False, aten.amin.default: False}


for _op in (aten.max.default, aten.min.default, aten.sum.default, aten.amax.default, aten.amin.default):
    SPECIAL[_op] = _reduce_known


# Note [Mask counts]: mixture-of-experts routers size each expert's batch by counting its tokens on the host:
# davidmrau's SparseDispatcher selects `nonzero(gates)` rows and splits them by `(gates > 0).sum(0).tolist()`. Every
# count read 0, and `split` refused sizes summing to 0 for the 20 rows (k = 4 of batch 5) nonzero had selected; a
# script reading `mask.sum().item()` as its number of selected elements got 0 where nonzero gave it 20. A count of a
# mask whose value is not known (`sum` of a bool tensor, `count_nonzero` of any) now reads, by default, the number
# of elements Note [Data-dependent shapes] selects from that mask (its nonzero bound, else `nonzero_fraction` of its
# elements) spread evenly over the count's elements, none above the elements it counts: the counts sum to the size
# nonzero and boolean indexing give the same mask, so splits by them agree, and each expert gets the same share, as a
# balanced router's do. It is a default answer (Note [Sanity checks read back as passing]): the value hook answers
# first, and it does not flow through further ops (a sum of the counts reads 0). Counts above KNOWN_VALUE_MAX_BYTES
# read zeros.
def _mask_count(func: Any, args: Any, kwargs: Any) -> Any:
    """sum over dims of a bool tensor, count_nonzero: read back as the selected count (Note [Mask counts])."""
    out = run_op(func, args, kwargs)
    if _known_values_enabled(args) and propagate_known(func, args, kwargs, out):
        return out
    _default_mask_count(args[0], out, func)
    return out


def _default_mask_count(mask: Any, out: Any, func: Any) -> None:
    """Give count `out` of unknown `mask` the default value Note [Mask counts] describes."""
    counts_any = func.overloadpacket is aten.count_nonzero
    if not isinstance(mask, EmuTensor) or not isinstance(out, EmuTensor) or not (counts_any or mask.dtype == torch.bool):
        return
    if not out.numel() or not mask.numel() or _nbytes(out) > KNOWN_VALUE_MAX_BYTES or _known_record(out) is not None:
        return
    counted_per_out = mask.numel() // out.numel()
    selected = min(_selected(mask.numel(), mask), counted_per_out * out.numel())
    base, extra = divmod(selected, out.numel())
    counts = torch.full((out.numel(),), base, dtype=torch.long, device="cpu")
    counts[:extra] += 1
    set_known_value(out, counts.reshape(out.shape).to(out.dtype), default=True)


for _op in (aten.sum.dim_IntList, aten.count_nonzero.default, aten.count_nonzero.dim_IntList):
    SPECIAL[_op] = _mask_count


# draws made so far whose values the host knows (multinomial, randperm): a forward that made one is never replayed
# (Note [Known draws in forward] in replay.py)
known_draws: list[int] = [0]


# Note [Sampled categories]: `torch.multinomial` (Categorical.sample(), `probs.multinomial(1)`) draws category indices
# on the GPU, and a reinforcement-learning loop reads them back every environment step (CleanRL's ppo.py:
# `envs.step(action.cpu().numpy())`). Read back as zeros, every action was 0: CartPole episodes all pushed left and
# ended after ~9 steps where an untrained (near-uniform) policy's last ~22, so the loop's host work (resets, episode
# bookkeeping) was not the real run's. A draw's result is now a value the host knows, as randperm's is: drawn from the
# device's emulated generator (torch.manual_seed seeds it; the host's own RNG is untouched), from the real
# probabilities when they are known on the host, else uniformly over the categories (the probabilities are not
# computed), without repeats when `replacement=False`. Indices are always in range, as a GPU's are. Like randperm's,
# the value is known, not a default: it flows through views and small ops (Categorical's `.T.reshape`, its sample
# validation and log_prob's index), which costs host time: ~0.16 ms of emulator host per ppo.py environment step
# (0.65 -> 0.83 ms), and the value hook is not asked. Outputs above KNOWN_VALUE_MAX_BYTES stay unknown (zeros), so
# large sampling costs no host time.
@_special(aten.multinomial.default)
def _multinomial(func: Any, args: Any, kwargs: Any) -> Any:
    """Run multinomial on meta; its small result reads back as in-range draws (Note [Sampled categories])."""
    out = run_op(func, args, kwargs)
    if isinstance(out, EmuTensor) and _nbytes(out) <= KNOWN_VALUE_MAX_BYTES:
        replacement = bool(args[2] if len(args) > 2 else kwargs.get("replacement", False))
        value = _sampled_categories(args[0], int(args[1]), replacement, kwargs.get("generator"), out._index)
        if value is not None:
            set_known_value(out, value)
            known_draws[0] += 1
    return out


def _sampled_categories(probs: torch.Tensor, num_samples: int, replacement: bool, generator: Any,
                        index: int) -> torch.Tensor | None:
    """Return host draws for `multinomial(probs, num_samples, replacement)` (Note [Sampled categories])."""
    from gpemu.torch_backend import rng

    if generator is None and rng._generators:
        generator = rng._generators[index]
    if generator is None:  # no emulated generator to draw from: leave the value unknown
        return None
    known = known_value(probs) if _known else None
    if known is not None:
        return torch.multinomial(known.double(), num_samples, replacement, generator=generator)
    rows, categories = tuple(probs.shape[:-1]), int(probs.shape[-1])
    if replacement:
        return torch.randint(categories, (*rows, num_samples), generator=generator, dtype=torch.long)
    keys = torch.rand((*rows, categories), generator=generator)
    return keys.argsort(dim=-1)[..., :num_samples].contiguous()


# Note [Writes without a version bump]: gpemu trusts what it knows about a tensor (its host value, value range,
# nonzero bound, softmax mass) until the tensor's version counter moves. A few aten ops write into arguments other
# than `self` and torch bumps no version for them (on the CPU and CUDA alike): `_fused_moving_avg_obs_fq_helper`,
# behind `torch.fused_moving_avg_obs_fake_quant`, updates the observer's running min / max and the fake-quant scale
# and zero point in place. QAT (torchvision references/classification/train_quantization.py: eager
# `prepare_qat` with the default qnnpack / fbgemm qconfig, FusedMovingAvgObsFakeQuantize) keeps those as buffers
# built on the host (min inf, max -inf, scale 1, zero point 0) and moved to the device, so they were known, and after
# every training step they still read inf / -inf / 1 / 0 where a GPU reads the observed range; converting the model
# then took the "observer never ran" branch (default qparams, with its warning). The op's schema marks the written
# arguments (`Tensor(a!)`): gpemu forgets what it knew about them after the op, so they read as computed values.
# Under inference mode the composite `fused_moving_avg_obs_fake_quant` itself reaches gpemu (QAT's evaluation runs in
# `torch.inference_mode()`, and observers still update there): it is handled the same way.
def forget_facts(t: EmuTensor) -> None:
    """Drop every value, range and bound gpemu recorded for `t` (Note [Writes without a version bump])."""
    _forget(id(t))
    for registry in (_nz_bounds, _mass, _ranges):
        registry.pop(id(t), None)


@_special(aten._fused_moving_avg_obs_fq_helper.default, aten.fused_moving_avg_obs_fake_quant.default)
def _writes_unbumped(func: Any, args: Any, kwargs: Any) -> Any:
    """Run the op; forget the facts about the arguments it writes (Note [Writes without a version bump])."""
    out = run_op(func, args, kwargs)
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, EmuTensor):
            forget_facts(value)
    return out


@_special(aten.allclose.default)
def _allclose(func: Any, args: Any, kwargs: Any) -> Any:
    """allclose reads a result on the host: charge the comparison, wait, answer True (sanity checks pass)."""
    x = args[0] if isinstance(args[0], EmuTensor) else args[1]
    charge(x._index, func, op_cost_s(aten.abs.default, (to_meta(x),), {}, to_meta(x), x._index))
    _sync(x._index, "allclose (host read)")
    return True


@_special(aten.bincount.default)
def _bincount(func: Any, args: Any, kwargs: Any) -> Any:
    """bincount with `minlength`: assume every value is below it (the confusion-matrix idiom); else unsupported."""
    x = args[0]
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    minlength = int(args[2] if len(args) > 2 else kwargs.get("minlength", 0))
    value = known_value(x) if _known else None
    if value is not None and value.numel():  # values the host knows (labels copied from the host): the real size
        minlength = max(minlength, int(value.max()) + 1)
    if minlength <= 0:
        raise UnsupportedOpError(
            f"gpemu cannot emulate aten op {func} without minlength: its output size is max(input) + 1, a tensor "
            "value, which is not computed. Workaround: pass minlength= (the number of bins, e.g. "
            "torch.bincount(x, minlength=num_classes**2)); gpemu then assumes every value is below it."
        )
    dtype = weights.dtype if weights is not None else torch.long
    meta = torch.empty((minlength,), dtype=dtype, device=META)
    charge(x._index, func, op_cost_s(aten.abs.default, (to_meta(x),), {}, meta, x._index))
    _sync(x._index, "bincount (max value read on the host)")  # CUDA bincount reads max(input) to size its output
    return wrap(meta, x._index, tag="bincount")


@_special(aten.repeat_interleave.Tensor)
def _repeat_interleave(func: Any, args: Any, kwargs: Any) -> Any:
    """repeat_interleave with tensor repeats needs `output_size` (the sum of the repeats, a tensor value)."""
    if kwargs.get("output_size") is None:
        raise UnsupportedOpError(
            f"gpemu cannot emulate aten op {func} without output_size: its output size is the sum of the repeats, "
            "a tensor value, which is not computed. Workaround: pass output_size= (as torch.compile also needs), "
            "or repeat by a Python int."
        )
    return _tensor_mod.run_op(func, args, kwargs)


def _inplace_noop(func: Any, args: Any, kwargs: Any) -> Any:
    """Ops with no meta kernel that only update tensors in place (AMP bookkeeping): charge a tiny kernel."""
    if not isinstance(args[0], torch.Tensor):
        # a list of tensors (GradScaler.unscale_ over every gradient): only the device is needed, and unwrapping
        # would build each replayed gradient's meta tensor (Note [Block wrappers] in tensor.py; BERT: ~2 ms a step)
        index = _first_index(args)
        charge(index if index is not None else state.require().current_device(), func, 2e-6)
        return None
    _uargs, _ukwargs, index, wrappers = unwrap_all(args, kwargs)
    charge(index, func, 2e-6)
    return wrap_outputs(args[0], index, wrappers, func)


def _amp_update_scale(func: Any, args: Any, kwargs: Any) -> Any:
    """GradScaler.update(): charge a tiny kernel; keep the scale and growth tracker known on the host."""
    _uargs, _ukwargs, index, _wrappers = unwrap_all(args, kwargs)
    charge(index, func, 2e-6)
    scale, tracker, found_inf = args[0], args[1], args[2]
    growth, backoff, interval = (list(args[3:]) + [kwargs.get(k) for k in (
        "scale_growth_factor", "scale_backoff_factor", "growth_interval")][len(args) - 3:])[:3]
    scale_v, tracker_v, found_v = _stale_value(scale), _stale_value(tracker), _stale_value(found_inf)
    if scale_v is not None and tracker_v is not None:  # See Note [GradScaler on the host]
        if found_v is not None and float(found_v.sum()) > 0:
            new_scale, new_tracker = scale_v * backoff, torch.zeros_like(tracker_v)
        elif int(tracker_v.reshape(-1)[0]) + 1 >= interval:
            new_scale, new_tracker = scale_v * growth, torch.zeros_like(tracker_v)
        else:
            new_scale, new_tracker = scale_v.clone(), tracker_v + 1
        set_known_value(scale, new_scale, bumps=1)  # torch bumps `self`'s version after this handler returns
        set_known_value(tracker, new_tracker)
    return args[0]


def _stale_value(t: torch.Tensor) -> torch.Tensor | None:
    """Return the host value recorded for `t` even if an in-place op bumped its version since (None if none)."""
    rec = _known.get(id(t)) if _known else None
    return rec[1] if rec is not None and rec[0]() is t and not rec[2] else None


# Note [GradScaler on the host]: torch's GradScaler keeps its scale and growth tracker on the device and updates
# them in place (`_amp_update_scale_`); gpemu knows their start values (small host values, see set_known_value) and
# applies the same rule on the host so `scaler.get_scale()` stays right: emulated gradients are finite (found_inf
# reads 0), so the scale doubles every `growth_interval` steps. Without this, get_scale() read 0 after the first
# update, and the Hugging Face idiom `optimizer_was_run = scale_before <= scaler.get_scale()` saw a skipped step.


# Note [Unscaling gradients]: GradScaler.unscale_ (`_amp_foreach_non_finite_check_and_unscale_`, once per device
# and dtype, from `scaler.unscale_(opt)` before gradient clipping or from `scaler.step(opt)`) was charged as a tiny
# 2 us kernel, like the scale update. On a GPU it is a multi-tensor kernel that reads and writes every gradient:
# ViT-B-32's 151 M fp32 gradients are 1.2 GB of traffic, ~0.85 ms on an A100, and an fp16 fine-tune of a 1 B
# parameter model pays ~5 ms a step on an A100, ~30 ms on a T4. It is now priced as `_foreach_mul_(grads,
# inv_scale)` is (cost/registry.py), from the wrappers' shapes: the list is not unwrapped (Note [Block wrappers] in
# tensor.py).
def _amp_unscale(func: Any, args: Any, kwargs: Any) -> Any:
    """GradScaler.unscale_(): charge a read and write of every gradient; emulated gradients are finite, so found_inf
    reads 0."""
    grads = args[0]
    if isinstance(grads, (list, tuple)) and grads:  # See Note [Unscaling gradients]
        from gpemu.cost.registry import op_cost
        from gpemu.cost.roofline import cost_time_s

        index = _first_index(args)
        index = index if index is not None else state.require().current_device()
        with torch._C.DisableTorchFunctionSubclass():
            seconds = cost_time_s(op_cost(func, args, kwargs, None), "_amp_foreach_non_finite_check_and_unscale_",
                                  state.require().devices[index].spec)
        charge(index, func, seconds)
        out = None
    else:
        out = _inplace_noop(func, args, kwargs)
    found_inf = args[1] if len(args) > 1 else kwargs.get("found_inf")
    if isinstance(found_inf, EmuTensor):
        set_known_value(found_inf, torch.zeros(tuple(found_inf.shape), dtype=found_inf.dtype))
    return out


SPECIAL[aten._amp_foreach_non_finite_check_and_unscale_.default] = _amp_unscale
SPECIAL[aten._amp_update_scale_.default] = _amp_update_scale


def unwrap_meta_call(func: Any, args: Any, kwargs: Any) -> Any:
    """Run `func` on the meta view of its arguments (no charge, no wrapping): for shape-only questions."""
    uargs, ukwargs, _, _ = unwrap_all(args, kwargs)
    return call_meta(func, uargs, ukwargs)


# Note [Known values through small ops]: a value read on the host can pick the path a script takes. Where the value
# comes from host data, reading zeros (or the sanity-check defaults) picks the wrong path: nn.TransformerEncoder's
# `_detect_is_causal_mask` builds a causal mask on the device and compares it with the user's mask
# (`bool((mask == causal).all())`), transformers' mask helpers ask `padding_mask.all()`. gpemu knows the values of
# small host copies, constants from factories and counters (above); propagate_known extends that through any
# deterministic op whose emulated tensor inputs all have known (not default) values and whose outputs are at most
# KNOWN_VALUE_MAX_BYTES each: the op also runs on the CPU values (tiny: masks, positions, counters), and the result
# is recorded with the host copies it derives from (`sources`, known_sources(): a read that depends on a step's input
# batch differs from one on constants: Note [Replay with host reads] in replay.py). Ops with a large or unknown input
# (a model's math) return at the first such argument.
# Tensors that require grad (parameters) never take part: they are the model's math, and small ones (biases, norm
# weights under KNOWN_VALUE_MAX_BYTES) are copied with their value, so every state_dict() detach, EMA update or
# optimizer-state zeros_like of them would be computed on the host too.

_value_ok: dict[Any, bool] = {}
# detach/alias share the value without computing it (the Trainer's evaluation detaches the labels it passes to
# compute_metrics; autograd and state_dict() detach known counters too)
_SHARE_VALUE_OPS = frozenset((aten.detach.default, aten.alias.default))


def _propagates(func: Any) -> bool:
    ok = _value_ok.get(func)
    if ok is None:
        schema = func._schema
        ok = _value_ok[func] = (torch.Tag.nondeterministic_seeded not in func.tags
                                and not any(a.kwarg_only and a.name == "out" for a in schema.arguments))
    return ok


class _Unknown(Exception):
    pass


def propagate_known(func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Record known values for the outputs of `func` when every emulated input has one (Note [Known values through
    small ops]); return True when it did."""
    for a in args:  # the common case first: a model's tensors are unknown, and the first one settles it
        if type(a) is EmuTensor:
            if id(a) not in _known or a.requires_grad:
                return False
            break
        if type(a) is list and a and type(a[0]) is EmuTensor:  # a foreach list: every element must be known
            if id(a[0]) not in _known or a[0].requires_grad:
                return False
            break
    if not _propagates(func):
        return False
    if func in _SHARE_VALUE_OPS:
        rec = _known_record(args[0])
        if rec is None or rec[1] or not isinstance(out, EmuTensor):
            return False
        set_known_value(out, rec[0], sources=_sources.get(id(args[0])), expr=_exprs.get(id(args[0])),
                        bumps=_shared_bumps(func, args[0], out))
        return True
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        if isinstance(o, EmuTensor) and o.numel() * o.element_size() > KNOWN_VALUE_MAX_BYTES:
            return False
    if not any(isinstance(o, EmuTensor) for o in outs):
        return False
    sources: set[int] = set()
    seen = [False]

    def host(a: Any) -> Any:
        if isinstance(a, EmuTensor):
            rec = _known_record(a) if not a.requires_grad else None  # parameters: the model's math, never
            if rec is None or rec[1]:
                raise _Unknown
            seen[0] = True
            sources.update(_sources.get(id(a), ()))
            return rec[0]
        if isinstance(a, (list, tuple)) and a and not isinstance(a[0], (int, float)):
            return type(a)(host(v) for v in a)
        if isinstance(a, torch.device) and a.type == "cuda":
            return torch.device("cpu")
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            raise _Unknown
        return a

    try:
        hargs = [host(a) for a in args]
        hkwargs = {k: host(v) for k, v in kwargs.items()}
    except _Unknown:
        return False
    if not seen[0]:
        return False
    frozen = frozenset(sources)
    mutable = func._schema.is_mutable
    # See Note [Read programs]: operands taken before an in-place op changes args[0]'s expression
    eargs = tuple(_operand(a) for a in args) if frozen else ()
    ekwargs = {k: _operand(v) for k, v in kwargs.items()} if frozen else {}
    try:
        if mutable:
            if out is not args[0] or func.is_view:
                return False
            target = hargs[0] = hargs[0].clone()
            func(*hargs, **hkwargs)
            set_known_value(args[0], target, bumps=1, sources=frozen,  # torch bumps the version after dispatch
                            expr=HostExpr(func, eargs, ekwargs, inplace=True) if frozen else None)
            if args[0]._base is not None:
                _write_through(args[0], target)  # See Note [Writes through views]
            return True
        hout = func(*hargs, **hkwargs)
    except Exception:  # an op the CPU cannot run on these values: the outputs stay unknown
        return False
    houts = hout if isinstance(hout, (tuple, list)) else (hout,)
    done = False
    for i, (o, h) in enumerate(zip(outs, houts, strict=False)):
        if isinstance(o, EmuTensor) and isinstance(h, torch.Tensor) and h.shape == o.shape:
            set_known_value(o, h, sources=frozen, expr=HostExpr(func, eargs, ekwargs, index=i) if frozen else None,
                            bumps=_shared_bumps(func, args[0], o))
            done = True
    return done


def _shared_bumps(func: Any, base: Any, view: EmuTensor) -> int:
    """Versions a view made inside dispatch will still gain: on its way out autograd gives it its base's version
    counter, which has counted the base's in-place ops (Note [Writes through views]); 0 for other outputs."""
    if not func.is_view or not isinstance(base, EmuTensor):
        return 0
    vb, vv = _version_of(base), _version_of(view)
    return vb - vv if vb >= 0 and vv >= 0 else 0


# Note [Writes through views]: `ptr[0] = n` writes a small known tensor through a view (select + copy_ of a 0-dim
# host tensor, which gpemu runs as fill_). On a GPU the base changes; here the view's value was updated (or, before,
# not even that: the copy_ handler skipped Note [Known values through small ops]) and the base, whose version counter
# the view shares, was then forgotten as modified: its next read returned zeros. facebookresearch/moco's queue keeps
# its position in a one-element buffer (`ptr = int(self.queue_ptr)`, `self.queue_ptr[0] = (ptr + batch) % K`): every
# step read 0 and wrote its keys over the same first columns of the queue, where a GPU run moves along it. Now an
# in-place op on a view whose value gpemu computes also writes that value into the base's known value (when the base
# is known and up to date), so the base stays known: 0, 16, 32, ... as on a GPU.
# A view made inside dispatch has a counter of its own (0) until autograd hands it its base's on the way out: a view
# of a base already modified in place (version 1 after the write above) was recorded at version 0 and forgotten at
# once as stale, so `int(ptr[1])` read 0 after any write to ptr; views now record the base's version.
def _write_view(value: torch.Tensor, size: Any, stride: Any, offset: int, part: Any) -> None:
    """Write `part` into the view (size, stride, offset) of host tensor `value` (in place)."""
    value.as_strided(size, stride, offset).copy_(part)


def _write_through(view: EmuTensor, part: torch.Tensor) -> None:
    """Write the new host value `part` of `view` into its base's known value (Note [Writes through views])."""
    base = view._base
    if not isinstance(base, EmuTensor):
        return
    rec = _known.get(id(base))
    if rec is None or rec[0]() is not base or rec[2] or rec[3] != _version_of(base):  # unknown, default or stale
        return
    value = _known_record(base)
    if value is None or value[0].shape != base.shape or value[0].stride() != base.stride():
        return
    offset = int(view.storage_offset() - base.storage_offset())
    new = value[0].clone()
    if new.stride() != base.stride():
        return
    try:
        _write_view(new, tuple(view.shape), view.stride(), offset, part)
    except RuntimeError:
        return
    sources = _sources.get(id(base), frozenset()) | _sources.get(id(view), frozenset())
    expr = HostExpr(_write_view, (_operand(base), tuple(view.shape), view.stride(), offset, _operand(view)),
                    inplace=True) if sources else None
    set_known_value(base, new, bumps=1, sources=sources, expr=expr)


def _set_item(value: torch.Tensor, index: Any, number: Any) -> None:
    value[index] = number


def setitem_number(t: EmuTensor, index: Any, number: Any, setitem: Any) -> None:
    """`t[index] = number`: torch builds the number on `t`'s meta device (its value is lost there) and copies it in;
    on a `t` whose value is known the write is made on that value too (Note [Writes through views])."""
    parts = index if isinstance(index, tuple) else (index,)
    rec = None
    if _known and not any(isinstance(i, (torch.Tensor, list)) for i in parts):
        rec = _known_record(t)
    operand = _operand(t) if rec is not None else None
    setitem(index, number)
    if rec is None or rec[1]:
        return
    new = rec[0].clone()
    try:
        _set_item(new, index, number)
    except (RuntimeError, IndexError, TypeError):
        return
    sources = _sources.get(id(t), frozenset())
    set_known_value(t, new, sources=sources,  # after the write: torch has bumped the version already
                    expr=HostExpr(_set_item, (operand, index, number), inplace=True) if sources else None)

