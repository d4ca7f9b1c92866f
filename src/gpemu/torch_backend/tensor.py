"""EmuTensor: a tensor on an emulated `cuda:N`, backed by a `meta` tensor (shape, dtype, strides; no bytes).

See Note [Why the wrapper lives on meta]: torch's autograd engine asks the device guard of every tensor it sees for
the current stream and a device thread. With a wrapper whose C++ device is `cuda`, a CUDA build without a driver
aborts the process inside `getCurrentCUDAStream`, and a CPU-only build raises "not linked with CUDA". The wrapper's
C++ device is therefore `meta` (which autograd runs on the calling thread), and everything Python can see —
`.device`, `.is_cuda`, `.get_device()`, repr, pickling — says `cuda:N`. Device *routing* of ops is done here, in
Python, not by the C++ dispatcher.
"""

from __future__ import annotations

import time
import weakref
from contextlib import suppress as _suppress
from typing import Any

import torch

from gpemu.device.allocator import SMALL_SIZE_BYTES, round_size
from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend import state
from gpemu.torch_backend.fusion import op_fusible
from gpemu.torch_backend.shapes import FAST

META = torch.device("meta")
_make_wrapper = torch.Tensor._make_wrapper_subclass  # type: ignore[attr-defined]
_DATA: Any = torch._C.TensorBase.data  # the C-level `.data` descriptor (EmuTensor overrides it to keep its key fresh)
_CUDA_DEVICES = [torch.device("cuda", i) for i in range(64)]

# storage id (StorageImpl address) -> [allocator handle, live wrapper count, device index(, block owner)]. See Note
# [Memory by storage]: views share the inner meta tensor's StorageImpl, so one allocation per storage, freed when the
# last wrapper over it dies. A 4th item is the _BlockOwner of a block wrapper's storage (Note [Block wrappers]):
# handle 0 (nothing of its own to free), the owner kept alive while any wrapper over that storage lives.
_live: dict[int, list[Any]] = {}


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


class EmuStorage(torch.UntypedStorage):
    """The storage Python sees for an emulated tensor: data_ptr() is a fake address, unique per emulated storage."""

    _emu_ptr: int

    def data_ptr(self) -> int:
        """Return the fake device address of this storage (shared by every view of it). See Note [Storage
        addresses]."""
        return self._emu_ptr

    def resize_(self, size: int) -> EmuStorage:  # type: ignore[override]
        """Resize this storage to `size` bytes, freeing or allocating its device block (Note [Storage resize])."""
        old = self.nbytes()
        torch.UntypedStorage.resize_(self, size)
        rec = _live.get(self._emu_ptr)
        if size != old and rec is not None and len(rec) == 3:  # a block wrapper's storage (4 items) keeps its block
            emu = state.require()
            allocator = emu.devices[rec[2]].allocator
            allocator.free(rec[0])
            rec[0] = 0  # nothing held while the new block is asked for (an out-of-memory error leaves it empty)
            rec[0] = allocator.malloc(size, emu.current_stream(rec[2]).pool_id, "resize_")
        return self


# Note [Storage resize]: FSDP2 frees each unsharded parameter after its forward and backward with
# `tensor.untyped_storage().resize_(0)` and allocates it again before the next all-gather with `resize_(nbytes)`
# (torch.distributed.fsdp._fully_shard._fsdp_param.free_storage / alloc_storage); on a GPU the caching allocator
# releases the block and hands out a new one. gpemu counted a storage's bytes once, when its first wrapper was made,
# so resizing changed nothing: an FSDP2 run held one unsharded copy of every parameter for good (pytorch/torchtitan's
# per-block fully_shard idiom; a 50 M-parameter MLP stack read 896.8 MiB allocated between steps instead of 704.6).
# EmuStorage.resize_ resizes the meta storage (so `size()` answers) and swaps the storage's allocation for one of the
# new size (none for 0 bytes) on the current stream; the data are not copied (they are never real).


_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage


# Note [Storage addresses]: an emulated tensor's storage is a meta storage, whose data_ptr() is 0 for every tensor.
# Libraries find tied and shared weights by storage address before saving: transformers' save_pretrained groups a
# state_dict by `untyped_storage().data_ptr()` (and refused to save: every parameter of one size "shared" storage),
# safetensors does the same. The Python storage object of an emulated tensor becomes an EmuStorage on first use
# (`__class__` is set once; torch keeps the same Python object for the storage while it lives), whose data_ptr() is the
# address of the meta StorageImpl behind the tensor: unique among live storages and equal for all views of one
# (a `detach()`ed state_dict entry and its parameter, tied weights). Tensor.data_ptr() adds the storage offset.


class EmuTensor(torch.Tensor):
    """A tensor on an emulated GPU: Python sees `cuda:N`; the data is a meta tensor; ops are priced and queued."""

    _elem: torch.Tensor
    _index: int
    _own: Any  # a block wrapper's _BlockOwner (Note [Block wrappers])

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # (shape, stride, dtype, index): the op cache's key for this tensor, set by __new__/fresh (None: not cacheable).
    # See Note [Host overhead]
    _mk: tuple[Any, ...] | None = None

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int, requires_grad: bool = False) -> EmuTensor:
        shape = elem.shape
        stride = elem.stride()
        dtype = elem.dtype
        r = _make_wrapper(
            cls,
            shape,
            strides=stride,
            storage_offset=elem.storage_offset(),
            dtype=dtype,
            layout=elem.layout,
            device=META,
            requires_grad=requires_grad,
        )
        r._elem = elem
        r._index = index
        r._mk = (shape, stride, dtype, index)
        return r  # type: ignore[no-any-return]

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        """Return the detached alias of this tensor (torch's `.data`)."""
        return _DATA.__get__(self)  # type: ignore[no-any-return]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # `p.data = q` (Module._apply, channels_last) changes this wrapper's strides without a dispatch: re-key it
        _DATA.__set__(self, value)
        if type(value) is EmuTensor and value is not self:
            _set_data(self, value)  # See Note [Set data]
        self._mk = (self.shape, self.stride(), self.dtype, self._index)

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """Return the emulated CUDA device."""
        return _CUDA_DEVICES[self._index]

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        """Return True: the tensor lives on an emulated CUDA device."""
        return True

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        """Return False: scripts must not see the meta backing."""
        return False

    def get_device(self) -> int:
        """Return the emulated device index."""
        return self._index

    def untyped_storage(self) -> torch.UntypedStorage:
        """Return this tensor's storage, whose data_ptr() is a fake device address (Note [Storage addresses])."""
        st = _UNTYPED_STORAGE(self)
        if type(st) is not EmuStorage:
            st.__class__ = EmuStorage
            st._emu_ptr = self._elem.untyped_storage()._cdata  # type: ignore[attr-defined]
        return st

    def data_ptr(self) -> int:
        """Return the fake device address of the first element (Note [Storage addresses])."""
        return self.untyped_storage().data_ptr() + int(self.storage_offset()) * self.element_size()

    def new(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        """Legacy `Tensor.new(...)` on the emulated device: torch's binding gave a dense wrapper's caller a plain meta
        tensor and refuses a sparse one's type (row-wise Adagrad's `grad.new(indices, values, size)`)."""
        if len(args) >= 2 and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
            return torch.sparse_coo_tensor(*args[:3])  # (indices, values[, size]): Note [Sparse tensors]
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0]  # `new(other)` aliases other
        device = kwargs.get("device") or self.device
        host = torch.empty(0, dtype=self.dtype).new(*args)
        if all(type(a) is int for a in args) or (len(args) == 1 and isinstance(args[0], torch.Size)):
            return torch.empty(tuple(host.shape), dtype=self.dtype, device=device)  # sizes: no data to copy
        return host.to(device)  # data: copied to the device

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, (int, float, bool)):  # See Note [Writes through views] in ops.py
            from gpemu.torch_backend.ops import setitem_number

            setitem_number(self, index, value, super().__setitem__)
            return
        super().__setitem__(index, value)

    def share_memory_(self) -> EmuTensor:
        """Return self: as for CUDA tensors, nothing moves to shared memory (`Module.share_memory()` in Hogwild)."""
        return self

    def is_shared(self) -> bool:
        """Return True, as torch does for every CUDA tensor."""
        return True

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
        from gpemu.torch_backend.ops import known_value, set_known_value

        value = known_value(self)  # a counter buffer's host value survives copy.deepcopy (EMA / SWA model copies)
        if value is not None:
            set_known_value(out, value.clone())
        if self.requires_grad:
            out.requires_grad_(True)
        if getattr(self, "_is_param", False):
            out._is_param = True  # type: ignore[attr-defined]
        memo[id(self)] = out
        return out

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        special = _special
        if special is None:
            special = _load_special()
        handler = special.get(func)
        meter = _meter
        if meter[2]:  # nested inside another op's handling: the outer call is being timed
            if handler is not None:
                return handler(func, args, kwargs or {})
            out = run_op(func, args, kwargs or {})
            if _known_values:  # See Note [Known values through small ops] in ops.py
                a0 = args[0] if args else None  # an unknown emulated first argument settles it without a call
                if type(a0) is not EmuTensor or id(a0) in _known_values:
                    _propagate(func, args, kwargs or {}, out)
            return out
        meter[2] = 1
        t0 = _perf_counter()
        try:
            if handler is not None:
                return handler(func, args, kwargs or {})
            out = run_op(func, args, kwargs or {})
            if _known_values:
                a0 = args[0] if args else None
                if type(a0) is not EmuTensor or id(a0) in _known_values:
                    _propagate(func, args, kwargs or {}, out)
            return out
        finally:
            meter[0] += _perf_counter() - t0
            meter[1] += 1
            meter[2] = 0


# Note [Emulator host time]: host seconds spent inside gpemu's op handling and the number of ops handled, counted at
# the outermost __torch_dispatch__ (~0.3 us per op). It is a lower bound of what emulation costs the script's thread:
# torch's own dispatch into Python (~8 us per op) and autograd are not inside it. The run report shows it per
# iteration and says when a run is bound by it rather than by the emulated GPU.
# Host waits on the GPU inside an op (`.item()`, a blocking copy, a full launch queue) are the GPU's time, not the
# emulator's: WaitsInsideOps (a device listener) counts them in slot 3 and emulator_host_time() leaves them out.
_meter: list[Any] = [0.0, 0, 0, 0.0]  # [seconds, ops, depth, seconds waited on the GPU inside ops]
_perf_counter = time.perf_counter


def emulator_host_time() -> tuple[float, int]:
    """Return (seconds inside gpemu's op handling, ops handled) since the process started (Note [Emulator host
    time]); host waits on the emulated GPU inside ops are not counted."""
    return float(_meter[0] - _meter[3]), int(_meter[1])


class WaitsInsideOps:
    """Device listener that counts host waits happening inside gpemu's op handling (see _meter)."""

    def on_work(self, work: Any) -> None:
        """Ignore work items."""

    def on_host_wait(self, start_s: float, end_s: float, reason: str) -> None:
        """Add the wait to the meter when it happened inside an op."""
        if _meter[2]:
            _meter[3] += end_s - start_s


_special: dict[Any, Any] | None = None  # gpemu.torch_backend.ops.SPECIAL, bound on first dispatch (import cycle)
_known_values: dict[int, Any] = {}  # gpemu.torch_backend.ops._known, bound with _special
_propagate: Any = None  # gpemu.torch_backend.ops.propagate_known, bound with _special


def _load_special() -> dict[Any, Any]:
    global _special, _known_values, _propagate
    from gpemu.torch_backend.ops import SPECIAL, _known, propagate_known

    _special, _known_values, _propagate = SPECIAL, _known, propagate_known
    return SPECIAL


class _StorageRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to one wrapper that releases its storage record when the wrapper dies."""

    __slots__ = ("key",)
    key: int
    # _refs hashes each reference once: weakref.ref's own hash is its referent's, i.e. a call of the Python-level
    # Tensor.__hash__ (~0.1 us more per wrapper). Identity is what _refs needs. See Note [Host overhead].
    __hash__ = object.__hash__


_refs: set[_StorageRef] = set()  # keeps the references (and so their callbacks) alive


def _on_dead(ref: _StorageRef) -> None:
    _refs.discard(ref)
    rec = _live.get(ref.key)  # _release(ref.key), inlined: one call per dying wrapper
    if rec is None:
        return
    rec[1] -= 1
    if rec[1] <= 0:
        del _live[ref.key]
        emu = state._current
        if emu is not None and rec[2] < len(emu.devices):
            emu.devices[rec[2]].allocator.free(rec[0])


# Note [Set data]: `p.data = q` (torch's Module._apply for `.half()`, `.float()`, `.to(dtype)` or
# `.to(memory_format=...)` of a module already on the device, which keeps each Parameter object) changes the
# wrapper's dtype and strides, but the wrapper kept its inner meta tensor and its storage record: after
# `model.cuda().half()` every op still ran on fp32 meta weights (a half Linear returned fp32 outputs, and the next
# layer died with "Input type (float) and bias type (c10::Half) should be the same": diffusers' UNet2DConditionModel
# moved to the device and then halved) and memory kept the fp32 bytes. A GPU makes `p` share `q`'s storage: the
# wrapper now takes `q`'s inner tensor, drops its count on its old storage (freed when nothing else holds it) and
# counts on `q`'s (its reference records are re-keyed, the old ones neutralised: a storage key can be reused once
# freed), and takes `q`'s host-known value, if any, instead of its own. A `q` whose storage gpemu does not track
# (none in practice) only lends its inner tensor.
def _set_data(t: EmuTensor, value: EmuTensor) -> None:
    """Make `t` share `value`'s inner tensor and storage record (Note [Set data])."""
    from gpemu.torch_backend import ops

    t._index = value._index
    elem = value._elem
    key = elem.untyped_storage()._cdata
    rec = _live.get(key)
    if rec is not None:
        for ref in [r for r in weakref.getweakrefs(t) if isinstance(r, _StorageRef)]:
            if ref.key == key:
                continue
            _refs.discard(ref)
            _on_dead(ref)  # this wrapper's count on its old storage
            ref.key = -1  # its callback, when `t` dies, finds no record
        if not any(isinstance(r, _StorageRef) and r.key == key for r in weakref.getweakrefs(t)):
            rec[1] += 1
            ref = _StorageRef(t, _on_dead)
            ref.key = key
            _refs.add(ref)
    t._elem = elem
    known = ops.known_value(value)
    ops._known.pop(id(t), None)
    if known is not None:
        ops.set_known_value(t, known.clone())


def wrap(elem: torch.Tensor, index: int, requires_grad: bool = False, tag: str = "") -> EmuTensor:
    """Return an EmuTensor over the meta tensor `elem` on device `index`, allocating its storage if it is new."""
    out = EmuTensor(elem, index, requires_grad)
    try:
        key = elem.untyped_storage()._cdata
    except NotImplementedError:  # a sparse tensor: no storage of its own (Note [Sparse tensors] in sparse.py)
        from gpemu.torch_backend.sparse import track_sparse

        return track_sparse(out, elem, index, tag)
    rec = _live.get(key)
    if rec is None:
        emu = state.require()
        handle = emu.devices[index].allocator.malloc(
            elem.untyped_storage().nbytes(), emu.current_stream(index).pool_id, tag
        )
        rec = _live[key] = [handle, 0, index]
    rec[1] += 1
    # a plain weakref with a callback, not weakref.finalize: ~5x cheaper per tensor. See Note [Host overhead].
    ref = _StorageRef(out, _on_dead)
    ref.key = key
    _refs.add(ref)
    return out


def storage_handle(t: EmuTensor) -> int:
    """Return the allocator handle of `t`'s storage (0 when it has none of its own: a block wrapper's or unknown)."""
    rec = _live.get(t._elem.untyped_storage()._cdata)
    return int(rec[0]) if rec is not None else 0


def live_storage_count() -> int:
    """Return how many emulated storages are alive (for tests and reports)."""
    return len(_live)


def to_meta(t: torch.Tensor) -> torch.Tensor:
    """Return the meta view of `t`: the inner tensor of an EmuTensor, or a meta tensor like a CPU tensor."""
    if isinstance(t, EmuTensor):
        return t._elem
    if t.is_meta:  # not t.device.type == "meta": that builds a device object
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
# set by gpemu.torch_backend.replay while it records a top module call: sink(index, name, predicted_s, category,
# stream_id) sees every charged op. See Note [Replay path].
record_sink: Any = None
# the arguments of the op being charged while record_sink is set (None otherwise): Note [Gradient sums across calls]
# in replay.py
sink_args: list[Any] = [None]
_mutable: dict[Any, bool] = {}


def _signature(x: Any) -> Any:
    if isinstance(x, torch.Tensor):  # 4-D strides: the memory format prices convolutions (Note [Memory format])
        return (tuple(x.shape), x.dtype, x.stride() if x.dim() == 4 else None)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    if isinstance(x, dict):  # kwargs: out= tensors are keyed by shape, never by repr (Tensor.__repr__ is slow)
        return tuple((k, _signature(v)) for k, v in x.items())
    try:
        hash(x)
    except TypeError:
        return repr(x)
    return x


class _Unwrapper:
    """Replaces emulated tensors by their meta tensors in one op's arguments (one level of lists: foreach, cat);
    notes whether a host tensor or a second emulated device was among them (Note [Tensors on two devices])."""

    __slots__ = ("index", "mixed", "wrappers")

    def __init__(self) -> None:
        self.index: int | None = None
        self.mixed = False
        self.wrappers: dict[int, EmuTensor] = {}

    def one(self, x: Any) -> Any:
        if isinstance(x, EmuTensor):
            if self.index is None:
                self.index = x._index
            elif x._index != self.index:
                self.mixed = True
            self.wrappers[id(x._elem)] = x
            return x._elem
        if isinstance(x, torch.Tensor):
            if not x.is_meta:
                self.mixed = True
            return to_meta(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self.one(v) for v in x) if x and not isinstance(x[0], int) else x
        if isinstance(x, torch.device):
            if x.type == "cuda" and self.index is None:
                self.index = x.index if x.index is not None else state.require().current_device()
            return META if x.type in ("cuda", "meta") else x
        return x


# Note [Tensors on two devices]: on a GPU, an op given a CUDA tensor and a CPU tensor of one or more dimensions
# raises "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!" (torch's
# dispatcher device check, which walks tensor lists too - `torch.cat([cuda_t, cpu_t])` names `wrapper_CUDA_cat` - and
# TensorIterator, where a 0-dim CPU tensor passes as a scalar). So does an op given tensors of two CUDA devices
# (cuda:0 and cuda:1), 0-dim or not. gpemu turned every CPU argument into a meta tensor and priced an op on its first
# emulated tensor's device, so a script that forgot a `.to(device)` ran here and died on the card: Lightning Fabric's
# transformer example without setup_dataloaders (`model(input)` with CPU token ids into a CUDA embedding),
# `nll_loss(cuda_logits, cpu_target)`, `torch.cat([cuda_t, cpu_t])`. gpemu raises the same error when the tensors
# among an op's arguments and inside its list arguments are not all on one device, 0-dim CPU tensors left out (torch
# rejects those in a list - `stack` - only through the dispatcher check; gpemu lets them pass everywhere rather than
# raise where a GPU might run). Exempt: ops whose CUDA kernels take tensors of another device (indexing with CPU or
# other-device indices, copies, packed-sequence lengths, CTC lengths). Foreach ops (`device_check: NoCheck`) fall
# back to a per-tensor loop when their lists span devices, so a list may span devices; the tensors at one position of
# the lists meet in one op and must share a device (`_foreach_add_(cuda_params, cpu_tensors)` raises,
# `_foreach_mul_([t0, t1], 2.0)` with t0 on cuda:0, t1 on cuda:1 runs, priced and placed on cuda:0), and a foreach
# op's tensor argument outside its lists is a scalar the CUDA kernel reads on the host (`_foreach_mul_(params,
# cpu_0dim)`) or the packed CPU `scalars` of `_foreach_addcdiv_.Tensor` / `_foreach_addcmul_.Tensor`, which must be
# on the CPU. Cost: the unwrapper notes a non-meta host tensor or a second device index while it unwraps (one
# comparison per emulated tensor), and only such calls are checked; an op cache hit never needs it (a host tensor has
# no cache key, and a call that must raise raised before it was cached). The replay path (replay.py) keys a call by
# its inputs' device index too, so an input on another GPU than the recording's runs per op and raises instead of
# replaying on the recording's device. torch.ctc_loss with CPU length tensors: for plain tensors torch reads the
# lengths on the host and builds the mean's divisor on the device, but for a tensor subclass it takes a composite
# path that divides the CUDA losses by the CPU lengths (forward and backward); gpemu's torch.ctc_loss passes CPU
# lengths as lists, the plain path's own step (patches.py).
_CROSS_DEVICE_OK = frozenset((
    "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
    "aten::_unsafe_index_put", "aten::_unsafe_masked_index", "aten::_unsafe_masked_index_put_accumulate",
    "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy", "aten::to", "aten::set_",
    "aten::lift_fresh", "aten::lift_fresh_copy", "aten::_pack_padded_sequence", "aten::_pad_packed_sequence",
    "aten::_cudnn_rnn", "aten::_cudnn_rnn_backward", "aten::ctc_loss", "aten::_ctc_loss", "aten::_ctc_loss_backward",
    "aten::_cudnn_ctc_loss", "aten::_use_cudnn_ctc_loss", "aten::record_stream", "aten::is_pinned",
    "aten::_pin_memory", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::broadcast_tensors",
))


# Note [Host tensors indexed on the device]: indexing takes indices on the CPU or on the indexed tensor's device
# (`cuda_t[cpu_idx]` runs), but not device indices into a host tensor: `cpu_t[cuda_idx]` raises "indices should be
# either on cpu or on the same device as the indexed tensor (cpu)" (check_indices_on_cpu_or_selfdevice in torch's
# index meta function). Diffusion code hits it when a scheduler table stays on the host and the timesteps are drawn
# on the device (`alphas_cumprod[t]`: diffusers moves its table to the device in add_noise first, several other
# code bases do not and fail on a GPU). aten::index is exempt from the two-devices check, so gpemu returned an
# emulated tensor there: it now raises torch's error for a host tensor indexed with an emulated index.
def _device_of(v: Any) -> str | None:
    """Return the device name an op argument puts on a GPU's device check, or None when it is exempt (not a tensor,
    a meta tensor, a 0-dim CPU tensor). See Note [Tensors on two devices]."""
    if type(v) is EmuTensor:
        return f"cuda:{v._index}"
    if not isinstance(v, torch.Tensor) or v.is_meta or (v.dim() == 0 and v.device.type == "cpu"):
        return None
    return str(v.device)


def _is_host(v: Any) -> bool:
    """Return True for a plain tensor that is not meta (a CPU tensor)."""
    return type(v) is not EmuTensor and isinstance(v, torch.Tensor) and not v.is_meta


def _check_devices(func: Any, args: Any, kwargs: Any) -> None:
    """Raise torch's error when the tensors of one op (lists included) are on two devices (Note [Tensors on two
    devices]); called only for calls whose unwrapping saw a host tensor or a second emulated device."""
    name = func._schema.name
    if name in _CROSS_DEVICE_OK:
        if name == "aten::index" and _is_host(args[0]) and any(type(i) is EmuTensor for i in args[1] if i is not None):
            # See Note [Host tensors indexed on the device]
            raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor (cpu) "
                               f"(gpemu: in {func}, as a GPU raises it)")
        return
    values = (*args, *kwargs.values()) if kwargs else args
    if name.startswith("aten::_foreach_"):
        lists = [v for v in values if isinstance(v, (list, tuple)) and v and not isinstance(v[0], (int, float))]
        for column in zip(*lists, strict=False):  # one per-tensor op of torch's slow path
            _same_device(func, column)
        return
    flat: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    _same_device(func, flat)


def _same_device(func: Any, values: Any) -> None:
    first = None
    for v in values:
        device = _device_of(v)
        if device is None:
            continue
        if first is None:
            first = device
        elif device != first:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {first} and "
                f"{device}! (gpemu: in {func}, as a GPU raises it)")


def unwrap_all(args: Any, kwargs: Any, func: Any = None) -> tuple[Any, Any, int, dict[int, EmuTensor]]:
    """Return (meta args, meta kwargs, device index, {id(inner): wrapper}) for one op call; with `func`, tensors on
    two devices raise as on a GPU (Note [Tensors on two devices])."""
    u = _Unwrapper()
    uargs = tuple(u.one(a) for a in args)
    ukwargs = {k: u.one(v) for k, v in kwargs.items()} if kwargs else {}
    if func is not None and u.mixed and u.wrappers:
        _check_devices(func, args, kwargs)
        if func._schema.name.startswith(("aten::_foreach_addcdiv", "aten::_foreach_addcmul")):
            # their packed `scalars` are read on the host, by the meta kernel too (Note [Tensors on two devices])
            uargs = tuple(a if _is_host(a) else ua for a, ua in zip(args, uargs, strict=True))
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


_fp32_modes: tuple[bool, bool] | None = None


# Note [TF32 flags between ops]
# The op caches key an op by its arguments, not by torch's TF32 flags (reading them costs ~2.7 us, a tenth of the
# emulator's per-op time), so check_fp32_modes() empties them when the flags changed. It ran at the top-level module
# calls only, so a script that times bare ops under both settings (`allow_tf32 = True`, time `a @ b`, `allow_tf32 =
# False`, time it again: a micro-benchmark) kept the TF32 price for the IEEE GEMMs, 6-8x too fast (a 4096^3 fp32
# matmul on an H200: 0.37 ms where the card took 2.82 ms, bench/data/h200-2026-11-27). The host synchronisation
# points (torch.cuda.synchronize, Stream.synchronize, Event.synchronize) check too: a flag changed between two timed
# regions is seen at the sync that closes the first.
def check_fp32_modes() -> tuple[bool, bool]:
    """Return torch's fp32 math modes; forget cached op costs when they changed since the last call (Note [FP32
    math modes] in cost/roofline.py: a script sets the TF32 flags before its model runs, or between runs)."""
    global _fp32_modes
    from gpemu.cost.roofline import fp32_math_modes

    modes = fp32_math_modes()
    if modes != _fp32_modes:
        if _fp32_modes is not None:
            _cost_cache.clear()
            _op_cache.clear()
        _fp32_modes = modes
    return modes


# Note [Caches per emulation]: the op cache and the cost cache key an op by its arguments and device index, not by the
# GPU: both hold the predicted time of the emulation that filled them. A second install() in one process with another
# GPU (`for gpu in ("v100", "a100"): gpemu.install(gpu); ...`) kept pricing ops as the first GPU (a 3x3 fp32
# convolution at 64 x 32 x 26 x 26 read V100's 156.2 us on the A100, whose own figure is 18.2 us). install() empties
# both.
def clear_op_caches() -> None:
    """Forget every cached op cost and op-cache entry (Note [Caches per emulation])."""
    _cost_cache.clear()
    _op_cache.clear()
    _cublas_done.clear()  # a new emulation's allocators hold no workspace yet


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


def charge(index: int, func: Any, predicted_s: float, category: str = "kernel", fusible: bool = False) -> None:
    """Enqueue one kernel of `predicted_s` (scaled by the phase calibration) on the current stream of `index`;
    `fusible`: a streaming op a compiled region fuses with its neighbours (Note [Compiled regions] in fusion.py)."""
    emu = state.require()
    _charge_on(emu, emu.current_stream(index), index, func if isinstance(func, str) else func.__name__, predicted_s,
               category, fusible)


def _charge_on(emu: Any, stream: Any, index: int, name: str, predicted_s: float, category: str = "kernel",
               fusible: bool = False) -> None:
    """Return charge() with the emulation and the current stream of `index` looked up by the caller (cache hits)."""
    fusion = emu.phases.fusion
    if fusion.active:  # See Note [Compiled regions] in fusion.py; recordings keep the fused price, replays reuse it
        predicted_s = fusion.adjust(predicted_s, fusible)
    duration_s, args = emu.phases.charge(predicted_s)
    stream.enqueue(duration_s, name, "compute", category, args)
    if record_sink is not None:
        record_sink(index, name, predicted_s, category, stream.stream_id)


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
    if not t.is_meta:  # an emulated tensor (its is_meta is False) or a host tensor
        return t
    return wrap(t, index, tag=_tag(func))


_tags: dict[Any, str] = {}


def _tag(func: Any) -> str:
    """Return str(func), cached (OpOverload.__str__ formats a string on every call)."""
    tag = _tags.get(func)
    if tag is None:
        tag = _tags[func] = str(func)
    return tag


# Note [Host overhead]: every aten op on an emulated tensor costs host CPU that a real GPU would not, and that CPU is
# taken from the script's data pipeline. Measures: C++ meta kernels plus hand-written shape functions for hot ops
# (shapes.py); gc.freeze() at install; a weakref callback instead of weakref.finalize per wrapper; and the op cache
# below: per (op, input metadata, scalars, autocast dtype) it remembers the predicted cost and what the op returns
# - fresh tensors (their sizes, strides, dtypes: rebuilt with empty_strided on meta, no meta kernel), its first
# argument (in-place ops), None (in-place foreach) - so a repeated op skips unwrapping, the meta kernel and pricing.
# Views and anything else run the generic path. Whole steps are cheaper still through the replay path (replay.py).
# Keys: each wrapper carries `_mk` = (shape, stride, dtype, device index), set once at creation, so keying a foreach
# op over 161 parameters is one attribute read per tensor instead of three C calls; the only way a wrapper's strides
# change without a dispatch is `t.data = other` (Module._apply, channels_last), and EmuTensor's `data` setter
# re-keys the wrapper. `_key_of` checks exact types first (EmuTensor, scalars, lists of ints). Fresh outputs of a
# cached op and replayed outputs/gradients are built by fresh(), which passes the known sizes and strides straight
# to the wrapper instead of reading them back from the meta tensor. `aten.detach` - which autograd calls on every
# tensor it saves for backward, ~40 % of the ops of a CNN training step - is built from the input's key (run_op's
# first branch, _alias).
# Smaller items, each measured A/B on tiny tensors: a cache hit looks the current stream up once for its kernel and
# its outputs (~0.7 us per lookup); Stream.enqueue reads the clock for the launch-queue check only when the queue
# could overflow; tests for meta use `.is_meta`, never `.device.type` (which builds a torch.device, ~1 us); weak
# references hash by identity (weakref.ref's hash calls the Python-level Tensor.__hash__).

_FRESH, _ARG0, _NONE, _GENERIC = 0, 1, 2, 3
_OP_CACHE_MAX = 200_000
_op_cache: dict[Any, tuple[int, Any, float, str, str, bool]] = {}  # key -> (kind, output metadata, cost, name, tag,
# fusible: Note [Compiled regions] in fusion.py)
_empty_strided = torch._C._VariableFunctions.empty_strided  # not torch.empty_strided: gpemu patches that one
_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
_SIMPLE_TYPES = frozenset(_SIMPLE)


def _key_of(x: Any) -> Any:
    """Return a hashable description of one op argument (None when it has none)."""
    t = type(x)  # exact-type fast paths first: this runs for every argument of every op
    if t is EmuTensor:
        return x._mk
    if t in _SIMPLE_TYPES:
        return x
    if (t is list or t is tuple) and x:
        t0 = type(x[0])
        if t0 is EmuTensor:  # foreach / cat: usually all emulated tensors
            try:
                keys = tuple([v._mk for v in x])
            except AttributeError:  # a None or a CPU tensor in the list
                keys = (None,)
            if None not in keys:
                return (t, keys)
        elif t0 is int:  # sizes, strides, dims: usually all ints
            parts = tuple(x)
            for v in parts:
                if type(v) is not int:
                    break
            else:
                return (t, parts)
    return _key_of_general(x)


def _key_of_general(x: Any) -> Any:
    if isinstance(x, EmuTensor):
        return x._mk
    if isinstance(x, _SIMPLE):
        return x
    if isinstance(x, (list, tuple)):
        parts = tuple(_key_of(v) for v in x)
        return None if None in parts and any(v is not None for v in x) else (type(x), parts)
    return None


# Note [Float scalars of list ops]: the op cache keys scalars by value (a view's sizes, a reduction's dims), so a
# fused or foreach optimizer kernel (`_fused_adamw_(params, grads, ..., lr=..., ...)`, `_foreach_addcdiv_(..., [step
# sizes])`) missed every step under a learning-rate schedule or Adam's bias correction: the transformers Trainer's
# fused AdamW cost ~4.7 ms of meta kernel and pricing per parameter group per step when not replayed. The outputs of
# `_foreach_*` / `_fused_*` ops have their list inputs' shapes and their cost counts elements and bytes, so no float
# value changes what they return or cost: for those ops a float, or a list of floats, is keyed by its type (and the
# list's length) only. Every other op keeps exact float keys (an interpolation's scale factors decide its shape).
_loose_ops: dict[Any, bool] = {}


def _is_loose(func: Any) -> bool:
    known = _loose_ops.get(func)
    if known is None:
        name = func._schema.name
        known = _loose_ops[func] = name.startswith(("aten::_foreach_", "aten::_fused_"))
    return known


def _key_loose(x: Any) -> Any:
    t = type(x)
    if t is float:
        return float
    if (t is list or t is tuple) and x and type(x[0]) is float and all(type(v) is float for v in x):
        return (t, len(x), float)
    return _key_of(x)


def _op_key(func: Any, args: Any, kwargs: Any, emu: Any) -> Any:
    key = [func, emu.autocast_dtype() if emu.autocast_seen else None]
    key_of = _key_loose if _is_loose(func) else _key_of  # See Note [Float scalars of list ops]
    for a in args:
        k = key_of(a)
        if k is None and a is not None:
            return None
        key.append(k)
    if kwargs:
        for name, v in kwargs.items():
            k = key_of(v)
            if k is None and v is not None:
                return None
            key.append(name)
            key.append(k)
    return tuple(key)


def _first_index(args: Any) -> int | None:
    for a in args:
        if isinstance(a, EmuTensor):
            return a._index
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], EmuTensor):
            return a[0]._index  # type: ignore[no-any-return]
    return None


class _Const:
    """A non-tensor value in a cached op's output tuple (returned as is on a cache hit)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _out_meta(out: Any, uargs: Any, ukwargs: Any, func: Any) -> tuple[int, Any]:
    """Return (kind, metadata) describing what `func` returned, for the op cache."""
    mutable = func._schema.is_mutable
    if func in _FREE_OPS or func.is_view:
        return _GENERIC, None
    if out is None:
        return (_NONE, None) if mutable else (_GENERIC, None)
    if mutable and uargs and out is uargs[0]:
        return _ARG0, None
    inputs = {t.untyped_storage()._cdata for t in _tensors((uargs, ukwargs))}
    metas: list[Any] = []
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if t is None:
            metas.append(None)
            continue
        if type(t) in (int, float, bool) and isinstance(out, (tuple, list)):  # e.g. flash attention's max_q
            metas.append(_Const(t))
            continue
        if not isinstance(t, torch.Tensor) or t.device.type != "meta" or t.layout is not torch.strided or (
                t.storage_offset()):  # a sparse output: its size is its nnz's (Note [Sparse tensors] in sparse.py)
            return _GENERIC, None
        storage = t.untyped_storage()
        if storage._cdata in inputs or storage.nbytes() != _empty_strided(
            t.shape, t.stride(), dtype=t.dtype, device=META
        ).untyped_storage().nbytes():
            return _GENERIC, None
        inputs.add(storage._cdata)
        metas.append((tuple(t.shape), t.stride(), t.dtype))
    return _FRESH, (metas[0] if isinstance(out, torch.Tensor) else (type(out), tuple(metas)))


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = tuple(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def fresh(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, index: int, tag: str) -> EmuTensor:
    """Return a new EmuTensor with its own fresh storage (wrap() without reading metadata back from meta)."""
    emu = state.require()
    return fresh_on(shape, stride, dtype, index, tag, emu.devices[index].allocator.malloc,
                    emu.current_stream(index).pool_id)


# Note [Block wrappers]: the replayed backward gives every parameter a new gradient each step (resnet50: 161). Built
# one by one (fresh_on), each costs a meta tensor, an allocation, a weak reference with a callback, and at
# zero_grad() a callback and a free: ~9 us per gradient, ~1.5 ms per step. fresh_block() builds them as block
# wrappers instead. Their memory is allocated by one allocator.malloc_many call, as block_sizes() lays it out: a
# large-pool gradient (> 1 MiB) gets its own allocation, as from fresh_on; small-pool gradients (resnet50: 143 of
# 161) are packed in order into allocations of at most 1 MiB, each the sum of their rounded sizes, which is exactly
# what the small pool hands out per gradient (it always splits off the rest of a block). memory_allocated and its
# peak are therefore those of per-gradient allocations; the "allocation" and "requested_bytes" stats count a pack
# as one allocation of its rounded bytes, and a pack needs its bytes contiguous (memory_reserved may differ by a
# small-pool segment or two). The allocations are owned by one _BlockOwner that each wrapper holds in its
# __dict__; it frees them all (allocator.free_many) when the last wrapper dies: one __del__, no weak reference per
# wrapper. Their meta tensor is built on first use
# (EmuTensor._elem is a _LazyElem: a non-data descriptor, so a wrapper whose __dict__ has `_elem` never reaches
# it): a replayed optimizer step and zero_grad() never unwrap a gradient, and an op cache hit keys on `_mk` alone.
# Building it registers the storage like any other (handle 0: the bytes stay the owner's, which the record keeps
# alive), so views, detach and in-place ops work as for fresh_on. The one deviation: a gradient that outlives the
# others keeps all of the block's allocations (freed when it dies). So only gradients that die together share a
# block: the replay uses it for the gradients it sets as `.grad` itself (Note [Direct gradients]), which
# zero_grad() drops together.


class _BlockOwner:
    """The allocations of the wrappers fresh_block() built together: freed when the last of them dies."""

    __slots__ = ("free_many", "handles")

    def __init__(self, free_many: Any, handles: list[int]) -> None:
        self.free_many = free_many
        self.handles = handles

    def __del__(self) -> None:
        with _suppress(Exception):  # at interpreter shutdown the allocator's module may be torn down
            self.free_many(self.handles)


class _LazyElem:
    """EmuTensor._elem of a block wrapper: its meta tensor, built and registered on first use (Note [Block wrappers])."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        shape, stride, dtype, index = obj._mk
        elem = _empty_strided(shape, stride, dtype=dtype, device=META)
        key = elem.untyped_storage()._cdata
        _live[key] = [0, 1, index, obj._own]
        ref = _StorageRef(obj, _on_dead)
        ref.key = key
        _refs.add(ref)
        obj._elem = elem
        return elem


EmuTensor._elem = _LazyElem()  # type: ignore[assignment]  # consulted only when the instance has no `_elem`


def meta_nbytes(meta: tuple[tuple[int, ...], tuple[int, ...], torch.dtype]) -> int:
    """Return the storage bytes of a fresh tensor of (shape, strides, dtype): its span times the item size."""
    shape, stride, dtype = meta
    if any(s == 0 for s in shape):
        return 0
    span = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))
    return span * dtype.itemsize


def block_sizes(sizes_bytes: list[int]) -> list[int]:
    """Return the allocations that hold tensors of `sizes_bytes` as the per-tensor mallocs would count them: each
    large-pool size on its own, small-pool ones packed in order into allocations of at most 1 MiB (the sum of their
    rounded sizes: a small-pool block is exactly its rounded size). See Note [Block wrappers]."""
    out: list[int] = []
    group = 0
    for size in sizes_bytes:
        if size == 0:
            continue
        rounded = round_size(size)
        if rounded > SMALL_SIZE_BYTES:
            out.append(size)
            continue
        if group + rounded > SMALL_SIZE_BYTES:
            out.append(group)
            group = 0
        group += rounded
    if group:
        out.append(group)
    return out


def fresh_block(metas: list[tuple[Any, ...]], sizes_bytes: list[int], tag: str, allocator: Any,
                stream_id: int) -> list[EmuTensor]:
    """Return new EmuTensors, one per (shape, stride, dtype, device index) in `metas`, whose memory is the
    allocations of `sizes_bytes` (block_sizes() of theirs), all freed when the last of them dies (see Note [Block
    wrappers])."""
    owner = _BlockOwner(allocator.free_many, allocator.malloc_many(sizes_bytes, stream_id, tag))
    out = []
    for mk in metas:
        w = _make_wrapper(EmuTensor, mk[0], strides=mk[1], dtype=mk[2], device=META)
        w._index = mk[3]
        w._mk = mk
        w._own = owner
        out.append(w)
    return out


def fresh_on(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, index: int, tag: str,
             malloc: Any, stream_id: int) -> EmuTensor:
    """Return fresh() with the device's allocator.malloc and the stream id looked up once by the caller (loops)."""
    elem = _empty_strided(shape, stride, dtype=dtype, device=META)
    out = _make_wrapper(EmuTensor, shape, strides=stride, dtype=dtype, device=META)
    out._elem = elem
    out._index = index
    out._mk = (shape, stride, dtype, index)
    storage = elem.untyped_storage()
    key = storage._cdata
    rec = _live.get(key)
    if rec is None:
        _live[key] = [malloc(storage.nbytes(), stream_id, tag), 1, index]
    else:  # cannot happen for a fresh storage; kept so the bookkeeping matches wrap()
        rec[1] += 1
    ref = _StorageRef(out, _on_dead)
    ref.key = key
    _refs.add(ref)
    return out  # type: ignore[no-any-return]


# Note [Foreach outputs]: a foreach op that returns a new tensor per list element (clip_grad_norm_'s
# `torch._foreach_norm` over every gradient: BERT 201 scalars; the temporaries of a foreach optimizer step that is
# not replayed) built each output with fresh_on, ~8-15 us apiece: ~3-6 ms per step for BERT's gradient clipping alone.
# On an op-cache hit such a list is built as block wrappers (Note [Block wrappers]): one malloc_many, meta tensors on
# first use. The outputs of one foreach call are used and dropped together (stacked, summed, added back), so the
# block's shared lifetime is theirs; one kept alone holds the list's bytes (BERT's norms: 201 x 512 B) until it dies.
_BLOCK_MIN = 8  # list outputs shorter than this are built one by one
_list_plans: dict[tuple[int, int], tuple[Any, list[tuple[Any, ...]], list[int]]] = {}


def _list_plan(metas: tuple[Any, ...], index: int) -> tuple[list[tuple[Any, ...]], list[int]] | None:
    """Return fresh_block()'s (metas with the device index, block sizes) for a cached list output, or None when an
    element is not a fresh tensor (a None or a constant)."""
    got = _list_plans.get((id(metas), index))
    if got is not None and got[0] is metas:
        return got[1], got[2]
    if not all(type(m) is tuple for m in metas):
        return None
    full = [(*m, index) for m in metas]
    sizes = block_sizes([meta_nbytes(m) for m in metas])
    if len(_list_plans) >= _OP_CACHE_MAX:
        _list_plans.clear()
    _list_plans[(id(metas), index)] = (metas, full, sizes)
    return full, sizes


_DETACH = torch.ops.aten.detach.default
# torch 2.14's OpOverload.__call__ checks a Python dispatcher first; older releases have no such attribute and
# always call `_op` (Note [Older torch releases] in emulation.py). Looked up once here, not per op.
_HAS_PYOBJ_DISPATCHER = hasattr(_DETACH, "_pyobj_dispatcher")


# Note [Tensor subclasses of emulated tensors]: `t.as_subclass(cls)` on a GPU returns a `cls` over the same data,
# attached to the autograd graph; torch's default `Tensor.__torch_function__` calls it on every result of an op on a
# Python tensor subclass (`_convert`), and MONAI builds its MetaTensor that way (`torch.as_tensor(x).as_subclass(
# MetaTensor)` in every transform's `convert_to_tensor`). On an EmuTensor torch's C++ `as_subclass` takes `alias()`,
# which our __torch_dispatch__ answers with a wrapper that already has its Python object (an EmuTensor), and refused:
# "Creating a new Tensor subclass MetaTensor but the raw Tensor object is already associated to a python object of
# type EmuTensor" (Project-MONAI/tutorials 3d_segmentation/torch/unet_training_array.py died in validation's
# `post_trans` = Activations(sigmoid=True) on the sliding-window output). gpemu takes the alias through dispatch
# (autograd records AliasBackward as on a GPU) and re-classes that new wrapper as an emulated `cls`: a class deriving
# from `cls` and EmuTensor (one per `cls`, named as `cls`), so `isinstance(out, cls)` holds, `cls`'s methods and
# `__torch_function__` run, and ops still reach EmuTensor's __torch_dispatch__. Its base restores torch's default
# `__torch_function__` under `cls`'s (EmuTensor disables it), so `super().__torch_function__` in `cls` wraps results
# in the subclass as on a GPU. `as_subclass(torch.Tensor)` returns the plain EmuTensor alias. A host result of an op
# on such a tensor (`.cpu()`, which `_convert` re-wraps with `as_subclass` of the emulated class) takes the script's
# own class: an emulated class over a CPU tensor made `.numpy()` refuse it as a device tensor (MONAI's
# plot_2d_or_3d_image reads `data.detach().cpu().numpy()`). The other way, `.to("cuda")` / `.cuda()` of a host
# tensor whose class has a __torch_function__ goes through it, as torch's own methods do, so a MetaTensor batch moved
# to the device stays a MetaTensor with its metadata (gpemu's patched `to` returned a plain EmuTensor).
_DEFAULT_TORCH_FUNCTION = torch.Tensor.__torch_function__.__func__  # type: ignore[attr-defined]


class _SubclassBase(EmuTensor):
    """Base of the emulated versions of a script's tensor subclasses (Note [Tensor subclasses of emulated tensors])."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        # torch's own default, called through a function of ours: torch's tensor metaclass swaps a class's
        # inherited default __torch_function__ for the disabled one when the class has a __torch_dispatch__
        return _DEFAULT_TORCH_FUNCTION(cls, func, types, args, kwargs)


_subclass_types: dict[type, type] = {}


def emulated_subclass(cls: type) -> type:
    """Return the class deriving from `cls` and EmuTensor (`cls` itself when it already derives from EmuTensor)."""
    if issubclass(cls, EmuTensor):
        return cls
    sub = _subclass_types.get(cls)
    if sub is None:
        meta: Any = type(cls)  # torch's tensor metaclass (or the subclass' own)
        sub = _subclass_types[cls] = meta(cls.__name__, (cls, _SubclassBase),
                                          {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                           "_emu_user_class": cls})
    return sub


def host_subclass(cls: type) -> type:
    """Return the script's class behind an emulated subclass (`cls` itself for any other class): a host result of an
    op on an emulated subclass tensor (`.cpu()`) is wrapped in the script's class, not the emulated one."""
    return cls.__dict__.get("_emu_user_class", cls)  # type: ignore[no-any-return]


def as_subclass(t: EmuTensor, cls: type) -> torch.Tensor:
    """Return `t.as_subclass(cls)` for an emulated `t` (Note [Tensor subclasses of emulated tensors])."""
    with torch._C.DisableTorchFunctionSubclass():  # `t`'s own class may be a subclass: its hook does not see this
        out = torch.ops.aten.alias.default(t)
    if cls is not torch.Tensor and cls is not EmuTensor:
        out.__class__ = emulated_subclass(cls)
    return out  # type: ignore[no-any-return]


def _alias(elem: torch.Tensor, index: int, mk: tuple[Any, ...] | None) -> EmuTensor | None:
    """Return a wrapper over the meta view `elem` of an existing storage (None when the storage is not tracked).

    `mk` is elem's (shape, stride, dtype, index) when the caller knows it (detach), else None (read from elem).
    """
    try:
        key = elem.untyped_storage()._cdata
    except NotImplementedError:  # a sparse detach: wrap() tracks its parts (Note [Sparse tensors] in sparse.py)
        return None
    rec = _live.get(key)
    if rec is None:
        return None
    if mk is None:
        mk = (elem.shape, elem.stride(), elem.dtype, index)
    out = _make_wrapper(EmuTensor, mk[0], strides=mk[1], storage_offset=elem.storage_offset(), dtype=mk[2],
                        device=META)
    out._elem = elem
    out._index = index
    out._mk = mk
    rec[1] += 1
    ref = _StorageRef(out, _on_dead)
    ref.key = key
    _refs.add(ref)
    return out  # type: ignore[no-any-return]


# Note [cuBLAS workspace in the drop-in]
# torch gives every (cuBLAS handle, stream) pair a workspace from the caching allocator at its first GEMM and keeps it
# for the process (Note [Library workspaces] in gpemu.memory.workspaces): 32 MiB on Hopper and Blackwell, 8.1 MiB
# before, or what CUBLAS_WORKSPACE_CONFIG asks. Handles are per thread and autograd runs the backward on its own
# device thread, so a training loop holds two (a real H200's resnet50 AMP step kept 363.7 MiB allocated: 300.5 of
# tensors and 2 x 32 MiB; session 12, docs/memory.md). The emulated device allocates them at the first cuBLAS op of
# each (thread, stream). Module replay leaves them out of what a recorded forward holds or peaks at (they are not the
# module's: `_Window` in replay.py, `live_since` in the allocator), so replay starts when it did without them.
_CUBLAS_OPS: frozenset[Any] = frozenset(
    getattr(torch.ops.aten, name).default for name in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot",
                                                       "vdot", "_int_mm"))


_cublas_done: set[tuple[int, int]] = set()  # (device, stream) pairs whose two threads hold their workspaces


def cublas_workspace(emu: Any, index: int, stream_id: int) -> None:
    """Allocate the cuBLAS workspace of this thread's handle on `stream_id` once (Note [cuBLAS workspace in the
    drop-in])."""
    from gpemu.memory.workspaces import cublas_workspace_bytes, ensure_cublas_workspace

    if not emu.cublas_workspace:
        return
    size_bytes = cublas_workspace_bytes(emu.devices[index].spec)
    # CUBLAS_WORKSPACE_CONFIG=:0:0 asks for none
    if size_bytes <= 0 or ensure_cublas_workspace(emu.devices[index].allocator, stream_id, size_bytes):
        _cublas_done.add((index, stream_id))


def run_op(func: Any, args: Any, kwargs: Any) -> Any:
    """Run one aten op on emulated tensors: shapes on meta, time on the stream, memory on the allocator."""
    if func is _DETACH and not kwargs and type(args[0]) is EmuTensor:
        # autograd detaches every tensor it saves for backward (~40 % of a CNN's ops): the cheapest path there is
        x = args[0]
        if x._mk is not None and not _inference_enabled():
            # the meta tensor's own `.detach()` (C++ binding, ~1 us) rather than the OpOverload (~3 us): the same
            # at::detach on a plain meta tensor
            out = _alias(x._elem.detach(), x._index, x._mk)
            if out is not None:
                return out
    if func.is_view and isinstance(args[0], EmuTensor) and not kwargs and _no_tensors(args, 1) and not (
            _sparse_live[0] and args[0].layout is not torch.strided):  # Note [Sparse matrices on the device]
        # a view of one emulated tensor: torch's C++ meta kernel gives the aliasing meta view; no kernel, no memory
        x = args[0]
        if _inference_enabled() and not x.is_inference():  # See Note [Views in inference mode]
            with torch.inference_mode(False):
                return wrap_outputs(func(x._elem, *args[1:]), x._index, {}, func)
        # OpOverload.__call__ is `self._op(...)` unless a Python kernel is registered: calling _op skips a frame
        # and an attribute check (~0.3-1 us on a view); torch < 2.14 always calls _op (Note [Older torch releases])
        elem = (func._op if not _HAS_PYOBJ_DISPATCHER or func._pyobj_dispatcher is None else func)(x._elem, *args[1:])
        if type(elem) is torch.Tensor and elem.is_meta:  # not .device.type: that builds a device object (~1 us)
            out = _alias(elem, x._index, None)
            if out is not None:
                return out
        return wrap_outputs(elem, x._index, {}, func)
    emu = state.require()
    if emu.autocast_seen and emu.autocast_dtype() is not None:  # See Note [Autocast casts take memory]
        from gpemu.torch_backend.autocast import hold_casts

        cast_index = _first_index(args)
        hold_casts(func, args, kwargs, cast_index if cast_index is not None else emu.current_device())
    key = _op_key(func, args, kwargs, emu)
    if key is None and _sparse_live[0] and _has_sparse(args, kwargs):  # never cached: see Note [Sparse tensors]
        from gpemu.torch_backend.sparse import run_sparse_op

        return run_sparse_op(func, args, kwargs)
    hit = _op_cache.get(key) if key is not None else None
    if hit is not None:
        kind, meta, cost, name, tag, fusible = hit
        index = _first_index(args)
        if index is not None and kind != _GENERIC:
            # the current stream is looked up once for the kernel and the outputs' allocations (~0.7 us each)
            stream = emu.current_stream(index)
            if func in _CUBLAS_OPS and (index, stream.stream_id) not in _cublas_done:  # Note [cuBLAS workspace in
                cublas_workspace(emu, index, stream.stream_id)  # the drop-in]
            if cost >= 0.0:
                if record_sink is not None:  # held only while charged: Note [Gradient sums across calls] in replay.py
                    sink_args[0] = args
                    _charge_on(emu, stream, index, name, cost, "kernel", fusible)
                    sink_args[0] = None
                else:
                    _charge_on(emu, stream, index, name, cost, "kernel", fusible)
            if kind == _FRESH:
                allocator = emu.devices[index].allocator
                malloc, stream_id = allocator.malloc, stream.pool_id
                if isinstance(meta[0], tuple):
                    return fresh_on(meta[0], meta[1], meta[2], index, tag, malloc, stream_id)
                if meta[0] is list and len(meta[1]) >= _BLOCK_MIN:  # See Note [Foreach outputs]
                    plan = _list_plan(meta[1], index)
                    if plan is not None:
                        return fresh_block(plan[0], plan[1], tag, allocator, stream_id)
                return meta[0](None if m is None else m.value if type(m) is _Const else fresh_on(
                    m[0], m[1], m[2], index, tag, malloc, stream_id) for m in meta[1])
            return args[0] if kind == _ARG0 else None
    uargs, ukwargs, index, wrappers = unwrap_all(args, kwargs, func)
    if emu.autocast_seen:
        from gpemu.torch_backend.autocast import adjust_for_autocast

        uargs, ukwargs, cast_s = adjust_for_autocast(
            func, uargs, ukwargs, emu.devices[index].spec, emu.autocast_dtype()
        )
    else:
        cast_s = 0.0
    try:
        out = call_meta(func, uargs, ukwargs)
    except (RuntimeError, NotImplementedError) as exc:
        if not _is_composite(func):
            from gpemu.torch_backend.ops import data_dependent_op

            return data_dependent_op(func, args, kwargs, exc)  # a handler, a clear error, or `exc` re-raised
        return func.decompose(*args, **kwargs)  # See Note [Composite ops on inference tensors]
    cost = -1.0
    fusible = False
    if func not in _FREE_OPS and not func.is_view:
        cost = op_cost_s(func, uargs, ukwargs, out, index) + cast_s
        fusible = op_fusible(func, uargs, ukwargs, out)
        sink_args[0] = args if record_sink is not None else None
        charge(index, func, cost, "kernel", fusible)
        sink_args[0] = None
        if func in _CUBLAS_OPS and index is not None:  # See Note [cuBLAS workspace in the drop-in]
            stream_id = emu.current_stream(index).stream_id
            if (index, stream_id) not in _cublas_done:
                cublas_workspace(emu, index, stream_id)
    if key is not None:
        if len(_op_cache) >= _OP_CACHE_MAX:
            _op_cache.clear()
        kind, meta = _out_meta(out, uargs, ukwargs, func)
        _op_cache[key] = (kind, meta, cost, func.__name__, _tag(func), fusible)
    if func.is_view and _inference_enabled() and not any(w.is_inference() for w in wrappers.values()):
        with torch.inference_mode(False):  # See Note [Views in inference mode]
            return wrap_outputs(out, index, wrappers, func)
    return wrap_outputs(out, index, wrappers, func)


_inference_enabled = torch.is_inference_mode_enabled
_sparse_live = [0]  # sparse wrappers made so far: run_op looks for them only once there have been some


def _has_sparse(args: Any, kwargs: Any) -> bool:
    """Return True when an emulated sparse tensor is among an op's arguments or in a list argument (a foreach op's);
    its `_mk` is None, so such a call is never cached."""
    for v in (*args, *kwargs.values()) if kwargs else args:
        for t in v if type(v) is list or type(v) is tuple else (v,):
            if type(t) is EmuTensor and t._mk is None and t.layout is not torch.strided:
                return True
    return False


def _no_tensors(args: Any, start: int) -> bool:
    """Return True when no argument from `start` on is a tensor (a loop: all() over a generator costs ~0.5 us)."""
    for a in args[start:]:  # noqa: SIM110 (a loop, not all(generator): see the docstring)
        if isinstance(a, torch.Tensor):
            return False
    return True

_composite: dict[Any, bool] = {}


def _is_composite(func: Any) -> bool:
    """Return True when `func` has a CompositeImplicitAutograd kernel (it is defined by other aten ops)."""
    known = _composite.get(func)
    if known is None:
        known = _composite[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        )
    return known


# Note [Composite ops on inference tensors]: for tensors made under torch.inference_mode, torch skips the Autograd
# keys, so composite ops that normally decompose before reaching __torch_dispatch__ (`item`, `is_nonzero` behind
# `if t:`, `to(device="cpu")`) arrive whole. When their meta kernel cannot run them (a host read, a device change),
# they are decomposed into the aten ops that define them, which gpemu handles (`_local_scalar_dense`, `_to_copy`).

# Note [Views in inference mode]: under torch.inference_mode a view of a normal tensor is a normal tensor, and
# torch's ADInplaceOrView kernel gives it its base's version counter after __torch_dispatch__ returns. A wrapper
# built inside inference mode is an inference tensor, which has no version counter ("Cannot set version_counter for
# inference tensor"), so the wrapper of such a view is built with inference mode off (e.g. `target[None]` inside
# torchvision's accuracy()).
