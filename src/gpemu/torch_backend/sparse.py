"""Sparse COO tensors on the emulated GPU: the gradients of `sparse=True` embeddings and what optimizers do with them.

Note [Sparse tensors]: `nn.EmbeddingBag(..., sparse=True)` and `nn.Embedding(..., sparse=True)` give their weight a
sparse COO gradient: indices [1, nnz] (the looked-up rows) and values [nnz, dim], nnz being the number of lookups,
not the table's rows. Recommendation models depend on it (facebookresearch/dlrm builds every table with
`sparse=True`: a dense gradient of its 1M-row tables would be a 64 MiB memset and a 64 MiB update per table and step,
where the sparse one is nnz x dim). gpemu raised an UnsupportedOpError for them (and crashed inside its op cache on
EmbeddingBag's, whose backward returns the sparse tensor directly). An emulated sparse tensor is an EmuTensor whose
layout is sparse_coo over a SparseMeta tensor, so `is_sparse`, `_indices()`, `_values()`, `_nnz()` and autograd's
accumulation behave as on a GPU:
- memory: a sparse tensor has no storage; its wrapper holds the storages of its indices and values (Note [Memory by
  storage] in tensor.py), so a gradient whose indices are the lookup's own index tensor (a GPU's
  `_sparse_coo_tensor_unsafe` aliases them) costs only its values;
- shapes: torch's SparseMeta kernels are few, and those there are lose nnz (`clone` and sparse + sparse return nnz
  0), so the result of every op on a sparse tensor comes from gpemu's rules here (`_OPS`), not from meta;
- time: ops on sparse tensors are never op-cached (their cost depends on nnz, which the cache key has not got: `_mk`
  is None) and are priced as the kernels a GPU runs, which touch nnz rows, never the dense size: the embedding-bag
  backward is one gather of the output gradient by offset2bag (`_embedding_bag_sparse_backward`); a dense
  parameter updated with a sparse gradient (`p.add_(grad, alpha=-lr)`, SGD) is, for an uncoalesced gradient (an
  embedding's always is), `values.mul(alpha)` and `index_add_` of the rows into the parameter
  (`add_out_dense_sparse_cuda`); sparse + sparse (gradient accumulation) concatenates indices and values; `clone` and
  `copy_` copy both; scaling by a scalar is one pass over the values; `zero_` and metadata queries (`_nnz`,
  `is_coalesced`) launch nothing; foreach ops over lists holding sparse tensors (SGD's momentum buffers) run per
  tensor, as torch's slow path does;
- `coalesce()` (SparseAdam, Adagrad) has no meta kernel (its nnz depends on the indices' values): its result keeps
  nnz (every index distinct: the upper bound, and what large tables with few lookups give) and is priced as a sort of
  the nnz keys plus a gather of the values.
Other ops with tensor results raise an UnsupportedOpError naming the op. Module replay never records a module with a
sparse embedding (it would give the weight a dense gradient), and optimizer replay never replays a step with a sparse
gradient (its nnz, and so the step's cost, changes).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend import state
from gpemu.torch_backend import tensor as _t
from gpemu.torch_backend.ops import _special
from gpemu.torch_backend.tensor import (
    META,
    EmuTensor,
    charge,
    op_cost_s,
    run_op,
    unwrap_all,
    wrap,
    wrap_outputs,
)

aten = torch.ops.aten


def _parts(elem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the meta indices and values of a sparse meta tensor."""
    return elem._indices(), elem._values()


def track_sparse(out: EmuTensor, elem: torch.Tensor, index: int, tag: str) -> EmuTensor:
    """Make `out` (a new wrapper over the sparse meta tensor `elem`) hold its indices' and values' storages."""
    out._mk = None  # never op-cached: an op's cost and output depend on nnz (Note [Sparse tensors])
    _t._sparse_live[0] += 1
    _hold(out, elem, index, tag)
    return out


def _hold(out: EmuTensor, elem: torch.Tensor, index: int, tag: str) -> None:
    """Count `out` on the storages of `elem`'s parts (Note [Memory by storage] in tensor.py)."""
    for part in _parts(elem):
        _count_on(out, part, index, tag)


def _count_on(out: EmuTensor, part: torch.Tensor, index: int, tag: str) -> None:
    """Count `out` on `part`'s storage, allocating it when gpemu does not track it yet."""
    storage = part.untyped_storage()
    key = storage._cdata
    rec = _t._live.get(key)
    if rec is None:
        emu = state.require()
        handle = emu.devices[index].allocator.malloc(storage.nbytes(), emu.current_stream(index).pool_id, tag)
        rec = _t._live[key] = [handle, 0, index]
    rec[1] += 1
    ref = _t._StorageRef(out, _t._on_dead)
    ref.key = key
    _t._refs.add(ref)


def _retrack(out: EmuTensor, tag: str) -> None:
    """After an in-place op gave a sparse tensor new parts (`add_`, `zero_`), move its counts to their storages."""
    parts = _parts(out._elem)
    keys = {part.untyped_storage()._cdata for part in parts}
    held = set()
    for ref in [r for r in weakref.getweakrefs(out) if isinstance(r, _t._StorageRef)]:
        if ref.key in keys:
            held.add(ref.key)
            continue
        _t._refs.discard(ref)
        _t._on_dead(ref)  # this wrapper's count on a storage it no longer uses (freed if it was the last)
        ref.key = -1  # its callback, when `out` dies, finds no record
    for part in parts:
        if part.untyped_storage()._cdata not in held:
            _count_on(out, part, out._index, tag)


def _is_sparse(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.layout is torch.sparse_coo


def _sparse_like(src: torch.Tensor, nnz: int, coalesced: bool = False, shape: list[int] | None = None) -> torch.Tensor:
    """Return a sparse meta tensor shaped like `src` (or `shape`) with `nnz` entries in new indices and values."""
    sparse_dim = src.sparse_dim()
    indices = torch.empty((sparse_dim, nnz), dtype=torch.long, device=META)
    values = torch.empty((nnz, *src._values().shape[1:]), dtype=src.dtype, device=META)
    return aten._sparse_coo_tensor_with_dims_and_tensors(  # type: ignore[no-any-return]
        sparse_dim, src.dense_dim(), list(src.shape) if shape is None else shape, indices, values, dtype=src.dtype,
        layout=torch.sparse_coo, device=META, is_coalesced=coalesced)


def _elementwise_s(t: torch.Tensor, index: int) -> float:
    """Return the time of one elementwise pass reading and writing `t` (a `mul` of it by a scalar)."""
    return op_cost_s(aten.mul.Scalar, (t, 1.0), {}, t, index)


def _copy_s(t: torch.Tensor, index: int) -> float:
    """Return the time of copying `t` (a `clone` of it)."""
    return op_cost_s(aten.clone.default, (t,), {}, t, index)


def _gather_s(out_values: torch.Tensor, index: int) -> float:
    """Return the time of gathering `out_values`' rows from a larger tensor: reads only the rows it returns (an
    `index_select` whose source is the result's size: the registry's rule would read the whole source)."""
    idx = torch.empty((int(out_values.shape[0]),), dtype=torch.long, device=META)
    return op_cost_s(aten.index_select.default, (out_values, 0, idx), {}, out_values, index)


def _index_add_s(rows: int, values: torch.Tensor, index: int) -> float:
    """Return the time of `index_add_` of `values`' rows into a tensor of `rows` rows (touches only those rows)."""
    target = torch.empty((rows, *values.shape[1:]), dtype=values.dtype, device=META)
    idx = torch.empty((int(values.shape[0]),), dtype=torch.long, device=META)
    return op_cost_s(aten.index_add_.default, (target, 0, idx, values), {}, target, index)


def _dense_plus_sparse(dense: torch.Tensor, sparse: torch.Tensor, alpha: Any, in_place: bool,
                       index: int) -> list[tuple[str, float]]:
    """Return the kernels of dense + alpha * sparse on a GPU (`add_out_dense_sparse_cuda`, uncoalesced path)."""
    values = sparse._values()
    kernels = []
    if not in_place:  # the result starts as a copy of the dense operand
        kernels.append(("copy_", _copy_s(dense, index)))
    if values.numel() == 0:
        return kernels
    if not sparse.is_coalesced() and alpha != 1:
        kernels.append(("mul", _elementwise_s(values, index)))  # `values = values.mul(value)`: not in place
    rows = int(torch.Size(dense.shape[: sparse.sparse_dim()]).numel())
    flat = values.reshape(int(values.shape[0]), -1)
    kernels.append(("index_add_", _index_add_s(rows, flat, index)))
    return kernels


# An op on sparse tensors: (func, meta args, meta kwargs, device index) -> (result, kernels, new parts of args[0]).
# The result is a meta tensor to wrap, or the in-place op's first argument; "new parts" is the sparse meta tensor an
# in-place op leaves in args[0] (its nnz changed), or None.
Impl = Callable[[Any, Any, Any, int], tuple[Any, list[tuple[str, float]], Any]]


def _unsupported(func: Any, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"gpemu cannot emulate aten op {func} on a sparse tensor ({why}). Workaround: make the gradient dense "
        "(`sparse=False` on the embedding, with a dense optimizer), or run this step on CPU tensors.")


def _add(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """add/sub with a sparse operand: dense +- sparse (an index_add_), or sparse +- sparse (a concatenation)."""
    a, b = uargs[0], uargs[1]
    alpha = ukwargs.get("alpha", uargs[2] if len(uargs) > 2 else 1)
    in_place = func._schema.is_mutable
    if not _is_sparse(a) and _is_sparse(b):
        out = a if in_place else torch.empty(tuple(a.shape), dtype=torch.result_type(a, b), device=META)
        return out, _dense_plus_sparse(a, b, alpha, in_place, index), None
    if _is_sparse(a) and _is_sparse(b):  # CUDA's add_out_sparse_cuda: cat of both; the result is uncoalesced
        out = _sparse_like(a, a._nnz() + b._nnz())
        kernels = [("cat", _copy_s(out._indices(), index)), ("cat", _copy_s(out._values(), index))]
        if alpha != 1 or func.__name__.startswith("sub"):
            kernels.append(("mul", _elementwise_s(b._values(), index)))
        return (a, kernels, out) if in_place else (out, kernels, None)
    raise _unsupported(func, "a sparse tensor plus a dense one: only dense + sparse and sparse + sparse are emulated")


def _clone(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """clone: new indices and values, two copies (torch's SparseMeta clone drops nnz)."""
    src = uargs[0]
    out = _sparse_like(src, src._nnz(), src.is_coalesced())
    return out, [("clone", _copy_s(src._indices(), index)), ("clone", _copy_s(src._values(), index))], None


def _copy(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """copy_ of a sparse tensor into a sparse one: it takes the source's nnz, two copies."""
    dst, src = uargs[0], uargs[1]
    if not (_is_sparse(dst) and _is_sparse(src)):
        raise _unsupported(func, "a copy between a sparse and a dense tensor")
    new = _sparse_like(src, src._nnz(), src.is_coalesced())
    return dst, [("copy_", _copy_s(src._indices(), index)), ("copy_", _copy_s(src._values(), index))], new


def _zero(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """zero_: nnz becomes 0 (`sparse_resize_and_clear_`); no kernel."""
    return uargs[0], [], _sparse_like(uargs[0], 0, coalesced=True)


def _scale(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """mul/div by a scalar, neg, pow by a scalar: one pass over the values (out of place: a copy of the indices)."""
    a = uargs[0]
    other = uargs[1] if len(uargs) > 1 else None
    if not _is_sparse(a) or _is_sparse(other) or (isinstance(other, torch.Tensor) and other.dim() != 0):
        raise _unsupported(func, "only a sparse tensor times or over a scalar is emulated")
    values = a._values()
    if func._schema.is_mutable:
        return a, [(func.__name__, _elementwise_s(values, index))], None
    out = _sparse_like(a, a._nnz(), a.is_coalesced())
    return out, [("clone", _copy_s(a._indices(), index)), (func.__name__, _elementwise_s(values, index))], None


def _to_dense(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """to_dense: zero a dense result, add the entries into it (`sparse_to_dense`)."""
    src = uargs[0]
    out = torch.empty(tuple(src.shape), dtype=src.dtype, device=META)
    zero_s = op_cost_s(aten.fill_.Scalar, (out, 0), {}, out, index)
    return out, [("fill_", zero_s), *_dense_plus_sparse(out, src, 1, True, index)], None


def _sparse_mask(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """dense.sparse_mask(mask): the mask's indices, the dense rows they select (a gather)."""
    mask = uargs[1]  # the dense operand's rows are gathered: only their count matters
    out = _sparse_like(mask, mask._nnz(), mask.is_coalesced())
    return out, [("clone", _copy_s(out._indices(), index)), ("index_select", _gather_s(out._values(), index))], None


def _coalesce(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """_coalesce: nnz kept (all indices distinct, the upper bound); a sort of the keys and a gather of the values."""
    src = uargs[0]
    nnz = src._nnz()
    out = _sparse_like(src, nnz, coalesced=True)
    keys = torch.empty((nnz,), dtype=torch.long, device=META)
    sort_s = op_cost_s(aten.sort.default, (keys,), {}, (keys, keys), index)
    return out, [("sort", sort_s), ("index_select", _gather_s(out._values(), index)),
                 ("clone", _copy_s(out._indices(), index))], None


# Note [Sparse matrices on the device]: graph networks keep their adjacency (and often their bag-of-words features)
# as sparse COO matrices built on the host and moved over: pytorch/examples gcn does `adj.to_sparse().to(device)` and
# `features.to_sparse().to(device)`, then `torch.mm(features, W)` and `torch.spmm(adj, support)`. On a GPU the move
# copies the indices and values (nnz-sized: Cora's 2708 x 1433 features are 49k entries, not 3.9M), mm of a sparse
# matrix by a dense one is cuSPARSE's SpMM (`s_addmm_out_sparse_dense_cuda`: a zeroed result, a coalesce when needed,
# then one CSR pass that reads nnz values and nnz rows of the dense operand and sums each row's products in registers,
# with no atomics: priced as a gather of those nnz rows, not as an index_add_), and its backward multiplies by
# `sparse.t()` (a clone with two index rows swapped, uncoalesced). gpemu gave the moved tensor torch's `empty_like`,
# a sparse meta tensor with nnz 0 and no memory, and mm had no rule: the gcn example died in its first forward with
# an UnsupportedOpError (session 5, before sparse tensors were emulated, had moved it as a dense tensor). Now the
# move keeps nnz and charges the two copies, and mm / t / transpose of a sparse matrix are priced as above. `t` and
# `transpose` are views to torch, so run_op's view path no longer takes sparse tensors (it gave t() nnz 0); their
# other views (`_indices()`, `_values()`) stay aliases. A module called with a sparse argument is never recorded for
# replay (the recording keys its inputs' storages, which a sparse tensor has not): it runs per op.
def sparse_to_device(src: torch.Tensor, index: int, non_blocking: bool = False) -> EmuTensor:
    """Move a sparse COO CPU tensor to emulated device `index`: nnz-sized indices and values, two host-to-device copies
    (Note [Sparse matrices on the device])."""
    from gpemu.torch_backend.ops import charge_h2d

    meta = _sparse_like(src, src._nnz(), src.is_coalesced())
    for part in _parts(meta):  # `indices.to(device)`, `values.to(device)`: pageable copies, never pinned
        charge_h2d(index, part.numel() * part.element_size(), False, non_blocking)
    return wrap(meta, index, tag="h2d")


def _mm(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """mm of a sparse matrix by a dense one: a dense result, priced as SpMM (Note [Sparse matrices on the device])."""
    a, b = uargs[0], uargs[1]
    if not _is_sparse(a) or _is_sparse(b) or a.dim() != 2 or b.dim() != 2 or a.dense_dim() != 0:
        raise _unsupported(func, "only a sparse 2-D matrix times a dense one is emulated")
    out = torch.empty((int(a.shape[0]), int(b.shape[1])), dtype=torch.result_type(a, b), device=META)
    kernels = [] if a.is_coalesced() else _coalesce(func, (a,), {}, index)[1]
    rows = torch.empty((a._nnz(), int(b.shape[1])), dtype=b.dtype, device=META)  # the dense rows the entries read
    kernels += [("fill_", op_cost_s(aten.fill_.Scalar, (out, 0), {}, out, index)), ("spmm", _gather_s(rows, index))]
    return out, kernels, None


def _transpose(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """t / transpose of a sparse matrix's sparse dims: a clone of indices and values with two index rows swapped,
    uncoalesced (Note [Sparse matrices on the device])."""
    src = uargs[0]
    dims = (0, 1) if func is aten.t.default else tuple(d % src.dim() for d in uargs[1:3])
    if src.dim() < 2 or dims[0] == dims[1]:
        return src, [], None
    if max(dims) >= src.sparse_dim():
        raise _unsupported(func, "only a transpose of two sparse dimensions is emulated")
    shape = list(src.shape)
    shape[dims[0]], shape[dims[1]] = shape[dims[1]], shape[dims[0]]
    out = _sparse_like(src, src._nnz(), coalesced=False, shape=shape)
    return out, [("clone", _copy_s(src._indices(), index)), ("clone", _copy_s(src._values(), index))], None


def _flag(func: Any, uargs: Any, ukwargs: Any, index: int) -> tuple[Any, list[tuple[str, float]], Any]:
    """_coalesced_: sets a flag; no kernel."""
    func(*uargs, **ukwargs)
    return uargs[0], [], None


_OPS: dict[Any, Impl] = {
    aten.add_.Tensor: _add, aten.add.Tensor: _add, aten.sub_.Tensor: _add, aten.sub.Tensor: _add,
    aten.clone.default: _clone, aten.copy_.default: _copy, aten.zero_.default: _zero,
    aten.mul.Tensor: _scale, aten.mul.Scalar: _scale, aten.mul_.Tensor: _scale, aten.mul_.Scalar: _scale,
    aten.div.Tensor: _scale, aten.div.Scalar: _scale, aten.div_.Tensor: _scale, aten.div_.Scalar: _scale,
    aten.neg.default: _scale, aten.neg_.default: _scale, aten.pow.Tensor_Scalar: _scale,
    aten._to_dense.default: _to_dense, aten.sparse_mask.default: _sparse_mask, aten._coalesce.default: _coalesce,
    aten._coalesced_.default: _flag,
    aten.mm.default: _mm, aten.t.default: _transpose, aten.transpose.int: _transpose,
}


def run_sparse_op(func: Any, args: Any, kwargs: Any) -> Any:
    """Run one op with an emulated sparse argument (Note [Sparse tensors]): the result from gpemu's own shape rules
    (torch's SparseMeta kernels are few and lose nnz), the time from the kernels a GPU runs."""
    if func._schema.name.startswith("aten::_foreach_"):
        return _foreach_per_tensor(func, args, kwargs)
    uargs, ukwargs, index, wrappers = unwrap_all(args, kwargs, func)
    impl = _OPS.get(func)
    if impl is None and func.is_view:  # `_indices()`, `_values()`: aliases, as run_op's view path makes them
        return wrap_outputs(func(*uargs, **ukwargs), index, {}, func)
    if impl is None:
        return _metadata_query(func, uargs, ukwargs)
    out, kernels, new_parts = impl(func, uargs, ukwargs, index)
    for name, cost_s in kernels:
        charge(index, name, cost_s)
    if new_parts is not None:  # an in-place op changed args[0]'s nnz: it takes the new parts
        target = args[0]
        target._elem = new_parts
        _retrack(target, str(func))
        return target
    return wrap_outputs(out, index, wrappers, func)


def _foreach_per_tensor(func: Any, args: Any, kwargs: Any) -> Any:
    """A foreach op over a list holding sparse tensors: one op per position, as torch's slow path does on a GPU
    (SGD with momentum keeps a sparse momentum buffer per sparse gradient)."""
    single = getattr(aten, func._schema.name[len("aten::_foreach_"):])
    lists = [i for i, a in enumerate(args) if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    outs = []
    for k in range(len(args[lists[0]])):
        call = [a[k] if i in lists else a for i, a in enumerate(args)]
        if len(args) > 1 and isinstance(args[1], (list, tuple)) and 1 not in lists:  # a list of scalars
            call[1] = args[1][k]
        outs.append(single(*call, **kwargs))
    return None if func._schema.is_mutable else outs


def _metadata_query(func: Any, uargs: Any, ukwargs: Any) -> Any:
    """An op outside gpemu's sparse rules: fine when it only reads metadata (`_nnz`, `is_coalesced`), else an error."""
    try:
        out = func(*uargs, **ukwargs)
    except (NotImplementedError, RuntimeError) as exc:
        raise _unsupported(func, str(exc).splitlines()[0][:120]) from None
    if any(isinstance(o, torch.Tensor) for o in (out if isinstance(out, (tuple, list)) else (out,))):
        raise _unsupported(func, "no rule for its result's nnz and kernels")
    return out


@_special(aten._sparse_coo_tensor_with_dims_and_tensors.default)
def _sparse_coo(func: Any, args: Any, kwargs: Any) -> Any:
    """A sparse tensor over emulated indices and values: no kernel, it aliases them (`_sparse_coo_tensor_unsafe`)."""
    uargs, ukwargs, index, _ = unwrap_all(args, kwargs, func)
    if ukwargs.get("is_coalesced") is None:  # uncoalesced unless it has one entry, as on a GPU (meta says coalesced)
        ukwargs["is_coalesced"] = int(uargs[4].shape[0]) < 2
    return wrap(func(*uargs, **ukwargs), index, tag=str(func))


@_special(aten._embedding_bag_backward.default)
def _embedding_bag_backward(func: Any, args: Any, kwargs: Any) -> Any:
    """EmbeddingBag's backward; with `sparse=True` a sparse gradient priced as the GPU's gather (Note [Sparse ...])."""
    sparse = args[9] if len(args) > 9 else kwargs.get("sparse", False)
    if not sparse:
        return run_op(func, args, kwargs)
    grad, indices, offset2bag = args[0], args[1], args[3]
    num_weights, mode = int(args[6]), int(args[8])
    per_sample_weights = args[10] if len(args) > 10 else kwargs.get("per_sample_weights")
    index = grad._index
    meta_grad, meta_indices, meta_o2b = _t.to_meta(grad), _t.to_meta(indices), _t.to_meta(offset2bag)
    nnz, width = int(meta_indices.numel()), int(meta_grad.shape[-1])
    values = torch.empty((nnz, width), dtype=meta_grad.dtype, device=META)
    kernels = [("index_select", op_cost_s(aten.index_select.default, (meta_grad, 0, meta_o2b), {}, values, index))]
    if mode == 1:  # mean: divide each row by its bag's size
        kernels.append(("div_", _elementwise_s(values, index)))
    if per_sample_weights is not None:
        kernels.append(("mul_", _elementwise_s(values, index)))
    if meta_indices.dtype == torch.long:  # `indices.reshape({1, -1}).to(kLong)`: a view of the lookup's indices
        sparse_indices = meta_indices.reshape(1, -1)
    else:
        sparse_indices = torch.empty((1, nnz), dtype=torch.long, device=META)
        kernels.append(("_to_copy", _copy_s(sparse_indices, index)))
    out = aten._sparse_coo_tensor_with_dims_and_tensors(
        1, 1, [num_weights, width], sparse_indices, values, dtype=meta_grad.dtype, layout=torch.sparse_coo,
        device=META, is_coalesced=False)
    for name, cost_s in kernels:
        charge(index, name, cost_s)
    return wrap(out, index, tag=str(func))
