"""EmuTensor: a tensor on an emulated `cuda:N`, backed by a `meta` tensor (shape, dtype, strides; no bytes).

See Note [Why the wrapper lives on meta]: torch's autograd engine asks the device guard of every tensor it sees for
the current stream and a device thread. With a wrapper whose C++ device is `cuda`, a CUDA build without a driver
aborts the process inside `getCurrentCUDAStream`, and a CPU-only build raises "not linked with CUDA". The wrapper's
C++ device is therefore `meta` (which autograd runs on the calling thread), and everything Python can see —
`.device`, `.is_cuda`, `.get_device()`, repr, pickling — says `cuda:N`. Device *routing* of ops is done here, in
Python, not by the C++ dispatcher.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend import state
from gpemu.torch_backend.shapes import FAST

META = torch.device("meta")
_CUDA_DEVICES = [torch.device("cuda", i) for i in range(64)]

# storage id (StorageImpl address) -> [allocator handle, live wrapper count, device index]. See Note [Memory by
# storage]: views share the inner meta tensor's StorageImpl, so one allocation per storage, freed when the last
# wrapper over it dies.
_live: dict[int, list[int]] = {}


def _release(key: int) -> None:
    rec = _live.get(key)
    if rec is None:
        return
    rec[1] -= 1
    if rec[1] <= 0:
        del _live[key]
        emu = state.current_emulation()
        if emu is not None and rec[2] < len(emu.devices):
            emu.devices[rec[2]].allocator.free(rec[0])


class EmuTensor(torch.Tensor):
    """A tensor on an emulated GPU: Python sees `cuda:N`; the data is a meta tensor; ops are priced and queued."""

    _elem: torch.Tensor
    _index: int

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int, requires_grad: bool = False) -> EmuTensor:
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=META,
            requires_grad=requires_grad,
        )
        r._elem = elem
        r._index = index
        return r  # type: ignore[no-any-return]

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        """Return the emulated CUDA device."""
        return _CUDA_DEVICES[self._index]

    @property  # type: ignore[override]
    def is_cuda(self) -> bool:
        """Return True: the tensor lives on an emulated CUDA device."""
        return True

    @property  # type: ignore[override]
    def is_meta(self) -> bool:
        """Return False: scripts must not see the meta backing."""
        return False

    def get_device(self) -> int:
        """Return the emulated device index."""
        return self._index

    def __repr__(self, *, tensor_contents: object = None) -> str:  # type: ignore[override]
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (
            f"tensor(<emulated>, size={tuple(self.shape)}, dtype={self.dtype}, device='cuda:{self._index}'{grad})"
        )

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return repr(self).__format__(format_spec)

    def __reduce_ex__(self, proto: Any) -> Any:  # type: ignore[override]
        # See Note [Saving emulated tensors]: a checkpoint holds zeros of the right shape and dtype as plain CPU
        # tensors, so it loads anywhere (torch.load(weights_only=True) included); values are never emulated.
        from gpemu.torch_backend.ops import device_to_host

        cpu = device_to_host(self, reason="torch.save")
        if isinstance(self, torch.nn.Parameter) or getattr(self, "_is_param", False):
            cpu = torch.nn.Parameter(cpu, requires_grad=self.requires_grad)
        return cpu.__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict[int, Any]) -> EmuTensor:
        out = run_op(torch.ops.aten.clone.default, (self,), {})
        if self.requires_grad:
            out.requires_grad_(True)
        if getattr(self, "_is_param", False):
            out._is_param = True  # type: ignore[attr-defined]
        memo[id(self)] = out
        return out

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        from gpemu.torch_backend.ops import SPECIAL

        handler = SPECIAL.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        return run_op(func, args, kwargs or {})


def wrap(elem: torch.Tensor, index: int, requires_grad: bool = False, tag: str = "") -> EmuTensor:
    """Return an EmuTensor over the meta tensor `elem` on device `index`, allocating its storage if it is new."""
    out = EmuTensor(elem, index, requires_grad)
    storage = elem.untyped_storage()
    key = storage._cdata
    rec = _live.get(key)
    if rec is None:
        emu = state.require()
        device = emu.devices[index]
        handle = device.allocator.malloc(storage.nbytes(), emu.current_stream(index).stream_id, tag)
        rec = _live[key] = [handle, 0, index]
    rec[1] += 1
    weakref.finalize(out, _release, key)
    return out


def live_storage_count() -> int:
    """Return how many emulated storages are alive (for tests and reports)."""
    return len(_live)


def to_meta(t: torch.Tensor) -> torch.Tensor:
    """Return the meta view of `t`: the inner tensor of an EmuTensor, or a meta tensor like a CPU tensor."""
    if isinstance(t, EmuTensor):
        return t._elem
    if t.device.type == "meta":
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)


# ---- the generic op path -------------------------------------------------------------------------------------

_FREE_OPS: set[Any] = set()  # ops that only touch metadata or allocate: no kernel
for _name in (
    "empty.memory_format",
    "empty_strided.default",
    "empty_like.default",
    "new_empty.default",
    "new_empty_strided.default",
    "lift_fresh.default",
    "set_.source_Storage_storage_offset",
    "set_.source_Tensor",
    "resize_.default",
    "record_stream.default",
):
    _packet, _, _overload = _name.partition(".")
    _FREE_OPS.add(getattr(getattr(torch.ops.aten, _packet), _overload))

_cost_cache: dict[Any, float] = {}
_mutable: dict[Any, bool] = {}


def _signature(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    try:
        hash(x)
    except TypeError:
        return repr(x)
    return x


class _Unwrapper:
    """Replaces emulated tensors by their meta tensors in one op's arguments (one level of lists: foreach, cat)."""

    __slots__ = ("index", "wrappers")

    def __init__(self) -> None:
        self.index: int | None = None
        self.wrappers: dict[int, EmuTensor] = {}

    def one(self, x: Any) -> Any:
        if isinstance(x, EmuTensor):
            if self.index is None:
                self.index = x._index
            self.wrappers[id(x._elem)] = x
            return x._elem
        if isinstance(x, torch.Tensor):
            return to_meta(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self.one(v) for v in x) if x and not isinstance(x[0], int) else x
        if isinstance(x, torch.device):
            if x.type == "cuda" and self.index is None:
                self.index = x.index if x.index is not None else state.require().current_device()
            return META if x.type in ("cuda", "meta") else x
        return x


def unwrap_all(args: Any, kwargs: Any) -> tuple[Any, Any, int, dict[int, EmuTensor]]:
    """Return (meta args, meta kwargs, device index, {id(inner): wrapper}) for one op call."""
    u = _Unwrapper()
    uargs = tuple(u.one(a) for a in args)
    ukwargs = {k: u.one(v) for k, v in kwargs.items()} if kwargs else {}
    if ukwargs.get("pin_memory"):
        ukwargs["pin_memory"] = False
    index = u.index if u.index is not None else state.require().current_device()
    return uargs, ukwargs, index, u.wrappers


def call_meta(func: Any, uargs: Any, ukwargs: Any) -> Any:
    """Run `func` on meta tensors; turn 'no meta kernel' failures into UnsupportedOpError naming the op."""
    fast = FAST.get(func)
    if fast is not None:
        out = fast(uargs, ukwargs)
        if out is not NotImplemented:
            return out
    try:
        return func(*uargs, **ukwargs)
    except NotImplementedError as exc:
        raise UnsupportedOpError(
            f"gpemu cannot emulate aten op {func} (no shape function on meta: {str(exc).splitlines()[0][:200]}). "
            "Workaround: run this step on CPU tensors (`.cpu()` before the op, `.cuda()` after), or register a "
            "shape function with torch.library.register_fake for it."
        ) from None


def op_cost_s(func: Any, uargs: Any, ukwargs: Any, out: Any, index: int) -> float:
    """Return the predicted kernel time of one op on device `index`, cached by (op, shapes, dtypes, scalars)."""
    key = (func, index, _signature(uargs), _signature(ukwargs))
    cost = _cost_cache.get(key)
    if cost is None:
        from gpemu.cost import op_time_s

        spec = state.require().devices[index].spec
        try:
            cost = float(op_time_s(func, uargs, ukwargs, out, spec))
        except Exception:  # a cost model bug must not break the user's script; price as a memory-bound op
            cost = 0.0
        _cost_cache[key] = cost
    return cost


def charge(index: int, func: Any, predicted_s: float, category: str = "kernel") -> None:
    """Enqueue one kernel of `predicted_s` (scaled by the phase calibration) on the current stream of `index`."""
    emu = state.require()
    duration_s, args = emu.phases.charge(predicted_s)
    stream = emu.current_stream(index)
    name = func if isinstance(func, str) else func.__name__
    stream.enqueue(duration_s, name, "compute", category, args)


def wrap_outputs(out: Any, index: int, wrappers: dict[int, EmuTensor], func: Any) -> Any:
    """Return `out` with meta tensors wrapped on `index` (in-place results map back to their input wrapper)."""
    if isinstance(out, torch.Tensor):
        return _wrap_one(out, index, wrappers, func)
    if isinstance(out, (tuple, list)):
        return type(out)(wrap_outputs(o, index, wrappers, func) for o in out)
    return out


def _wrap_one(t: torch.Tensor, index: int, wrappers: dict[int, EmuTensor], func: Any) -> Any:
    w = wrappers.get(id(t))
    if w is not None:
        if w.shape != t.shape:
            raise UnsupportedOpError(
                f"aten op {func} changed the shape of an emulated tensor in place ({tuple(w.shape)} -> "
                f"{tuple(t.shape)}); gpemu cannot resize wrapper tensors. Workaround: use the out-of-place form."
            )
        return w
    if t.device.type != "meta":
        return t
    return wrap(t, index, tag=str(func))


def run_op(func: Any, args: Any, kwargs: Any) -> Any:
    """Run one aten op on emulated tensors: shapes on meta, time on the stream, memory on the allocator."""
    uargs, ukwargs, index, wrappers = unwrap_all(args, kwargs)
    emu = state.require()
    if emu.autocast_seen:
        from gpemu.torch_backend.autocast import adjust_for_autocast

        uargs, ukwargs, cast_s = adjust_for_autocast(
            func, uargs, ukwargs, emu.devices[index].spec, emu.autocast_dtype()
        )
    else:
        cast_s = 0.0
    out = call_meta(func, uargs, ukwargs)
    if func not in _FREE_OPS and not func.is_view:
        charge(index, func, op_cost_s(func, uargs, ukwargs, out, index) + cast_s)
    return wrap_outputs(out, index, wrappers, func)
