"""The torch patches: torch.cuda.*, torch.accelerator.*, Tensor.to/cuda/pin_memory, factories with device='cuda'.

Every change goes through a Patcher that remembers the original attribute, so uninstall() restores torch exactly.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import handle_torch_function, has_torch_function_unary

from gpemu.errors import GpemuError
from gpemu.torch_backend import (
    accelerator_api,
    cpp_extension,
    cuda_api,
    default_device,
    flex_attention,
    graphs,
    hf_generate,
    legacy,
    nvml,
    nvtx,
    profiling,
    rng,
    serialization,
    state,
    vision_io,
)
from gpemu.torch_backend.ops import (
    KNOWN_VALUE_MAX_BYTES,
    device_to_host,
    finite_check_passes,
    host_to_device,
    install_meta_equal,
    known_draws,
    peer_copy,
    set_known_value,
    set_nonzero_bound,
    set_value_range,
)
from gpemu.torch_backend.pinned import is_pinned, mark_pinned, pin
from gpemu.torch_backend.tensor import META, EmuTensor, charge, check_fp32_modes, host_subclass, wrap
from gpemu.torch_backend.tensor import as_subclass as emulated_as_subclass

_MISSING = object()


class Patcher:
    """Sets attributes and remembers the originals."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._scripted: list[int] = []  # ids registered in TorchScript's builtin table
        self._undo: list[Callable[[], None]] = []  # other changes to undo (an import hook's removal)

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Call `undo` when restoring (before the attributes set until then are put back)."""
        self._undo.append(undo)

    def set(self, obj: Any, name: str, value: Any) -> None:
        """Replace `obj.name` with `value` (remembering the original)."""
        self._saved.append((obj, name, obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING))
        table = torch.jit._builtins._get_builtin_table()
        op = table.get(id(getattr(obj, name, None)))
        if op is not None and id(value) not in table:  # See Note [TorchScript sees the original builtins]
            table[id(value)] = op
            self._scripted.append(id(value))
        setattr(obj, name, value)

    def restore(self) -> None:
        """Put every original back, newest first."""
        self._restore_to((0, 0, 0))

    @contextlib.contextmanager
    def optional(self, what: str) -> Iterator[None]:
        """Apply a block of patches that the emulation can do without: if the block raises (a torch release without
        what it patches), undo what it set, say so on stderr and go on; a failure to undo it is raised (Note [Older
        torch releases] in emulation.py)."""
        mark = (len(self._undo), len(self._saved), len(self._scripted))
        try:
            yield
        except Exception as exc:
            self._restore_to(mark)
            print(f"gpemu: {what} is not emulated with torch {torch.__version__} ({type(exc).__name__}: {exc}); "
                  "everything else is", file=sys.stderr)

    def _restore_to(self, mark: tuple[int, int, int]) -> None:
        """Undo every change made after `mark` (counts of undos, attributes and TorchScript entries), newest first;
        every change is undone even when one fails, and the first failure is raised at the end."""
        undo_n, saved_n, scripted_n = mark
        error: Exception | None = None
        while len(self._undo) > undo_n:
            try:
                self._undo.pop()()
            except Exception as exc:
                error = error or exc
        while len(self._saved) > saved_n:
            obj, name, value = self._saved.pop()
            try:
                if value is _MISSING:
                    with contextlib.suppress(AttributeError):
                        delattr(obj, name)
                else:
                    setattr(obj, name, value)
            except Exception as exc:
                error = error or exc
        table = torch.jit._builtins._get_builtin_table()
        while len(self._scripted) > scripted_n:
            table.pop(self._scripted.pop(), None)
        if error is not None:
            raise error


# Note [TorchScript sees the original builtins]: gpemu replaces some torch functions (factories such as
# torch.ones_like, torch.conv2d, F.scaled_dot_product_attention) with Python wrappers. TorchScript resolves a call
# inside a scripted function by looking the callee up in its builtin table by identity; a wrapper is not there, so it
# tried to compile the wrapper's source and failed ("module, class, method, function ... expected, got
# builtin_function_or_method"): timm 0.6 scripts activation functions with `@torch.jit.script` at import. Each
# wrapper is registered under the aten op of the function it replaces, so scripted code calls the op itself (which
# dispatches to gpemu like any other op on emulated tensors); restore() removes the entries.


def _cuda_index(device: Any) -> int | None:
    """Return the emulated index when `device` names a CUDA device, else None."""
    if device is None:
        return None
    if isinstance(device, int):
        return state.require().check_index(device)
    if isinstance(device, str):
        if not device.startswith("cuda"):
            return None
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "cuda":
        emu = state.require()
        return emu.check_index(device.index) if device.index is not None else emu.current_device()
    return None


# ---- Tensor methods ------------------------------------------------------------------------------------------


def _patched_to(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], EmuTensor):  # tensor.to(other)
            other = args[0]
            kwargs.setdefault("dtype", other.dtype)
            args = (other.device, *args[1:])
        copy = bool(kwargs.pop("copy", False))
        device, dtype, non_blocking, fmt = torch._C._nn._parse_to(*args, **kwargs)
        index = _cuda_index(device)
        relayout = fmt is not None and fmt != torch.preserve_format
        if isinstance(self, EmuTensor):
            if device is not None and device.type == "cpu":
                return device_to_host(self, reason="tensor.to(cpu)", dtype=dtype)
            out: torch.Tensor = self
            if index is not None and index != self._index:
                out = peer_copy(self, index)
            if dtype is not None and dtype != out.dtype:
                out = orig(out, dtype=dtype)
            elif copy and out is self:
                out = orig(out, dtype=out.dtype, copy=True)
            return out.contiguous(memory_format=fmt) if relayout else out
        if index is None:
            return orig(self, *args, copy=copy, **kwargs) if copy else orig(self, *args, **kwargs)
        if type(self) is not torch.Tensor and has_torch_function_unary(self):  # Note [Tensor subclasses of emulated
            # tensors] in tensor.py: a host subclass (MONAI's MetaTensor) moved to the device stays one, as on a GPU
            return handle_torch_function(to, (self,), self, *args, copy=copy, **kwargs)
        out = host_to_device(self, index, non_blocking, dtype)
        if relayout:
            out = out.contiguous(memory_format=fmt)
        if self.requires_grad and torch.is_grad_enabled():
            out.requires_grad_(True)
        return out

    return to


def _patched_as_subclass(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def as_subclass(self: torch.Tensor, cls: type) -> Any:
        if isinstance(self, EmuTensor):  # Note [Tensor subclasses of emulated tensors] in tensor.py
            return emulated_as_subclass(self, cls)
        return orig(self, host_subclass(cls))

    return as_subclass


def _patched_isfinite(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def isfinite(self: torch.Tensor) -> Any:
        out = orig(self)
        return finite_check_passes(out) if isinstance(self, EmuTensor) else out  # Note [Finite checks read
        # back as passing] in ops.py

    return isfinite


def _patched_type_as(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def type_as(self: torch.Tensor, other: torch.Tensor) -> Any:
        if isinstance(other, EmuTensor) or isinstance(self, EmuTensor):  # Note [type_as across devices] in ops.py
            return self.to(other)
        return orig(self, other)

    return type_as


def _patched_cuda(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        index = cuda_api.device_index(device)
        if isinstance(self, EmuTensor):
            return self if index == self._index else peer_copy(self, index)
        if type(self) is not torch.Tensor and has_torch_function_unary(self):  # as in `to` above
            return handle_torch_function(cuda, (self,), self, device, non_blocking, **kwargs)
        return host_to_device(self, index, non_blocking)

    return cuda


def _patched_pin_memory(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        if isinstance(self, EmuTensor):
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        return self if is_pinned(self) else pin(self)

    return pin_memory


def _patched_is_pinned(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def is_pinned_(self: torch.Tensor, device: Any = None) -> bool:
        return False if isinstance(self, EmuTensor) else is_pinned(self)

    return is_pinned_


def _patched_tolist(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def tolist(self: torch.Tensor) -> Any:
        if isinstance(self, EmuTensor):
            return device_to_host(self, reason="tensor.tolist()").tolist()
        return orig(self)

    return tolist


def _patched_numpy(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self, EmuTensor):
            raise TypeError(
                f"can't convert cuda:{self._index} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                "to host memory first."
            )
        return orig(self, *args, **kwargs)

    return numpy


def _patched_new_tensor(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def new_tensor(self: torch.Tensor, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False,
                   **kwargs: Any) -> Any:
        if not isinstance(self, EmuTensor) or (device is not None and _cuda_index(device) is None):
            return orig(self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        if isinstance(data, torch.Tensor):
            data = data.detach()
            out = data.to(device or self.device, dtype or data.dtype, copy=True)
        else:
            out = torch.tensor(data, dtype=dtype or self.dtype, device=device or self.device)
        return out.requires_grad_(True) if requires_grad else out

    return new_tensor


def _patched_init_process_group(orig: Callable[..., Any], patcher: Patcher | None = None) -> Callable[..., Any]:
    """torch.distributed.init_process_group: an NCCL group (or the default backend, which would pick NCCL for cuda)
    of one rank is created with gpemu's one-rank backend (Note [One-rank process groups]); a larger world raises a
    GpemuError that names the limit. CPU backends (gloo) are left alone."""

    @functools.wraps(orig)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        from gpemu.distributed import BACKEND_NAME, register_backend, world_size_of
        from gpemu.distributed.process_group import MULTI_RANK_HINT

        name = str(backend or "").lower()
        # no backend: with CUDA "available" torch picks NCCL for cuda (ProcessGroupNCCL: "no GPUs found")
        if "nccl" in name or (not name and not str(kwargs.get("device_id") or "").startswith("cpu")):
            size = world_size_of(args, kwargs)
            if size is not None and size != 1:
                raise GpemuError(f"init_process_group(backend={backend!r}): {MULTI_RANK_HINT.format(size=size)}")
            register_backend()
            kwargs.pop("device_id", None)  # binds NCCL communicators to a real device: nothing to bind here
            out = orig(BACKEND_NAME, *args, **kwargs)
            if patcher is not None:
                patch_dtensor(patcher)  # Note [FSDP2]
            return out
        return orig(backend, *args, **kwargs)

    return init_process_group


def _patched_ddp_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    """DistributedDataParallel over emulated parameters in a one-rank gpemu group (Note [DDP on one rank])."""

    @functools.wraps(orig)
    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        if not any(isinstance(p, EmuTensor) for p in module.parameters()):
            orig(self, module, *args, **kwargs)
            return
        from gpemu.distributed.ddp import init_emulated_ddp

        init_emulated_ddp(orig, self, module, args, kwargs)

    return __init__


def _patched_record_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if not isinstance(self, EmuTensor):
            orig(self, stream)

    return record_stream


# ---- factories -----------------------------------------------------------------------------------------------

_FILL_FACTORIES = ("zeros", "ones", "full", "rand", "randn", "randint", "arange", "eye", "linspace", "logspace",
                   "randperm", "scalar_tensor", "normal", "zeros_like", "ones_like", "full_like", "rand_like",
                   "randn_like", "randint_like", "range", "tril_indices", "triu_indices", "hann_window",
                   "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")
# deterministic fill factories whose small results keep their host value (Note [Known values through small ops])
_KNOWN_FACTORIES = frozenset(("zeros", "ones", "full", "arange", "eye", "linspace", "logspace", "scalar_tensor",
                              "range", "tril_indices", "triu_indices", "hann_window", "hamming_window",
                              "blackman_window", "bartlett_window", "kaiser_window"))
_EMPTY_FACTORIES = ("empty", "empty_strided", "empty_like", "empty_permuted")
_HOST_FACTORIES = ("tensor", "as_tensor", "asarray")


def _patched_factory(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    kind = "host" if name in _HOST_FACTORIES else ("empty" if name in _EMPTY_FACTORIES else "fill")

    @functools.wraps(orig)
    def factory(*args: Any, **kwargs: Any) -> Any:
        index = _cuda_index(kwargs.get("device"))
        if index is None:
            if kwargs.get("pin_memory"):  # a host tensor born pinned: torch asks the (absent) driver for the buffer
                kwargs["pin_memory"] = False
                host = orig(*args, **kwargs)
                mark_pinned(host)  # pinned-memory tutorial: torch.randn(n, pin_memory=True) died "no NVIDIA driver"
                return host
            return orig(*args, **kwargs)
        requires_grad = bool(kwargs.pop("requires_grad", False))
        kwargs.pop("pin_memory", None)
        if name.endswith("_like") and args and _wrapper_subclass(args[0]):  # Note [Like-factories of subclasses]
            out = orig(*args, **kwargs)
        elif kind == "host":
            if args and isinstance(args[0], EmuTensor):
                out = args[0].to(kwargs.get("device"), dtype=kwargs.get("dtype"))
            else:
                kwargs["device"] = "cpu"
                out = host_to_device(orig(*args, **kwargs), index)
        else:
            kwargs["device"] = META
            if args and isinstance(args[0], EmuTensor):  # *_like(emulated, device=...)
                args = (args[0]._elem, *args[1:])
            meta = orig(*args, **kwargs)
            out = wrap(meta, index, tag=f"torch.{name}")
            if name == "randperm":
                _record_randperm(out, orig, args, kwargs, index)
            elif name in _KNOWN_FACTORIES and meta.numel() * meta.element_size() <= KNOWN_VALUE_MAX_BYTES:
                # constants (GradScaler's scale, positions, masks): See Note [Known values through small ops]
                set_known_value(out, orig(*args, **{**kwargs, "device": "cpu"}), sources=frozenset())
            elif name in ("zeros", "zeros_like"):  # a large mask to scatter into: See Note [Nonzero bounds] in ops.py
                set_nonzero_bound(out, 0)
            elif name == "arange" and meta.numel():  # positions beyond the known size: Note [Value ranges] in ops.py
                _record_arange_range(out, args, kwargs)
            if kind == "fill":
                nbytes = meta.numel() * meta.element_size()
                charge(index, f"{name} (fill)", nbytes / state.require().devices[index].spec.memory_bw_bytes_per_s)
        if requires_grad:
            out.requires_grad_(True)
        return out

    return factory


# Note [Like-factories of subclasses]: `torch.empty_like(t, device="cuda")` of a wrapper tensor subclass (a DTensor)
# goes, on a GPU, through the subclass's __torch_dispatch__, which builds the same subclass over the like-factory of
# its inner tensors. gpemu's factory built an emulated tensor over the subclass itself, so `Module.to_empty(device=
# "cuda")` of a model built on the meta device and sharded with FSDP2 (pytorch/torchtitan's llama3 trainer: meta
# init, fully_shard per block, to_empty, init_weights) left every DTensor parameter on the meta device, and the first
# forward raised "FSDP parameters should be materialized from meta device". Such a factory keeps its `cuda` device and
# runs torch's own: the subclass dispatches the aten factory on its inner tensors, which gpemu emulates.
def _wrapper_subclass(t: Any) -> bool:
    """Return True for a traceable wrapper tensor subclass other than gpemu's own (Note [Like-factories of
    subclasses])."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return isinstance(t, torch.Tensor) and not isinstance(t, EmuTensor) and is_traceable_wrapper_subclass(t)


def _record_arange_range(out: EmuTensor, args: Any, kwargs: Any) -> None:
    """Record the range of an integer `arange(start, end, step)` too large to keep its value."""
    if out.dtype.is_floating_point or out.dtype.is_complex:
        return
    with contextlib.suppress(TypeError, ValueError, RuntimeError):  # bounds given as device tensors: no range
        start = args[0] if len(args) > 1 else kwargs.get("start", 0)
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
        first, last = int(start), int(start) + int(step) * (out.numel() - 1)
        set_value_range(out, min(first, last), max(first, last))


# Note [Large device permutations]: a device randperm is drawn on the host too and its whole value kept, so that a
# sampler's `randperm(n).tolist()` yields real indices. Its size had no cap: nerf-pytorch shuffles every training ray
# with `torch.randperm(rays_rgb.shape[0])` at each pass, 960,000 rays (7.7 MB of int64) for six 400 x 400 frames, but
# ~64 M (512 MB of host memory, ~2 s of host time) for a full-resolution 100-frame lego set (session 15). Above
# RANDPERM_KNOWN_MAX elements the permutation is not drawn: its elements read as values in [0, n) (a value range,
# Note [Value ranges] in ops.py: `perm.max()` reads n - 1), and indexing with it is shape-only, as any computed index.
RANDPERM_KNOWN_MAX = 1 << 23  # 8,388,608 elements: 64 MB of int64


def _record_randperm(out: EmuTensor, orig: Callable[..., Any], args: Any, kwargs: Any, index: int) -> None:
    """Draw the permutation on the host too, so a sampler's `randperm(n).tolist()` yields real indices (up to
    RANDPERM_KNOWN_MAX elements: Note [Large device permutations])."""
    if out.numel() > RANDPERM_KNOWN_MAX:
        set_value_range(out, 0, out.numel() - 1)
        return
    generator = kwargs.get("generator")
    if generator is None and rng._generators:
        generator = rng._generators[index]
    host_kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "layout", "out")}
    host_kwargs["generator"] = generator
    set_known_value(out, orig(*args, device="cpu", **host_kwargs))
    known_draws[0] += 1  # Note [Known draws in forward] in replay.py


# ---- torch.cuda / torch.accelerator --------------------------------------------------------------------------


def _synchronize(device: Any = None) -> None:
    state.require().devices[cuda_api.device_index(device)].synchronize()
    check_fp32_modes()  # See Note [TF32 flags between ops]


def _mem(method: str) -> Callable[..., Any]:
    def fn(device: Any = None) -> Any:
        return getattr(state.require().devices[cuda_api.device_index(device)].allocator, method)()

    fn.__name__ = method
    fn.__doc__ = f"Return the emulated allocator's {method}()."
    return fn


# Note [bf16 before Ampere]: torch.cuda.is_bf16_supported() answers True on any CUDA GPU by default: below compute
# capability 8.0 it falls through (including_emulation=True) to creating a bf16 tensor on the device, which succeeds
# on a V100 or T4 (bf16 storage and casts work there; the math runs without bf16 tensor cores). Only
# `including_emulation=False` reduces it to the capability check. gpemu answered the capability check either way,
# so on an emulated V100 transformers' `--bf16` stopped at "Your setup doesn't support bf16/gpu" and autocast(bfloat16)
# raised, where the real card trains (slowly), and scripts that pick bf16 when it is "supported" (nanoGPT) took fp16.
# The cost model prices bf16 math before Ampere at the fp32 CUDA-core peak (`_boost_peak_flops` in cost/model.py).
def _bf16_supported(spec: Any) -> Callable[..., bool]:
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        """Return torch's answer on `spec`: True from compute capability 8.0, and with emulation on any GPU."""
        return bool(including_emulation) or spec.compute_capability[0] >= 8

    return is_bf16_supported


def cuda_functions(emu: state.Emulation) -> dict[str, Any]:
    """Return the torch.cuda attributes gpemu replaces, by name."""
    count = len(emu.devices)
    spec = emu.devices[0].spec
    return {
        "is_available": lambda: True,
        "device_count": lambda: count,
        "current_device": emu.current_device,
        "set_device": lambda device: emu.set_device(cuda_api.device_index(device)),
        "device": cuda_api.DeviceContext,
        "get_device_name": lambda device=None: emu.devices[cuda_api.device_index(device)].spec.name,
        "get_device_properties": cuda_api.get_device_properties,
        "get_device_capability": lambda device=None: emu.devices[cuda_api.device_index(device)].spec.compute_capability,
        "get_arch_list": lambda: [f"sm_{spec.compute_capability[0]}{spec.compute_capability[1]}"],
        "is_bf16_supported": _bf16_supported(spec),
        "synchronize": _synchronize,
        "Stream": cuda_api.Stream,
        "Event": cuda_api.Event,
        "current_stream": cuda_api.current_stream,
        "default_stream": cuda_api.default_stream,
        "set_stream": cuda_api.set_stream,
        "stream": cuda_api.StreamContext,
        **rng.cuda_rng_functions(emu),
        "device_of": cuda_api.DeviceOf,
        "StreamContext": cuda_api.StreamContext,
        "utilization": cuda_api.utilization,
        "list_gpu_processes": cuda_api.list_gpu_processes,
        # Note [CUDA graphs] in gpemu/device/graph.py; torch's own make_graphed_callables runs on these
        "CUDAGraph": graphs.CUDAGraph,
        "graph": graphs.graph,
        "graph_pool_handle": graphs.graph_pool_handle,
        "make_graphed_callables": torch.cuda.graphs.make_graphed_callables,
        **{name: cuda_api.nvml_unsupported(name) for name in ("temperature", "power_draw", "memory_usage",
                                                               "current_blas_handle")},
        # Note [Driver queries with a modelled answer] in cuda_api.py
        "_sleep": cuda_api.cuda_sleep,
        "clock_rate": cuda_api.clock_rate,
        "device_memory_used": cuda_api.device_memory_used,
        "caching_allocator_alloc": cuda_api.caching_allocator_alloc,
        "caching_allocator_delete": cuda_api.caching_allocator_delete,
        "get_per_process_memory_fraction": cuda_api.get_per_process_memory_fraction,
        "ExternalStream": cuda_api.unsupported_class(
            "ExternalStream", "it wraps a cudaStream_t made outside torch, and there is no driver",
            "use torch.cuda.Stream()"),
        "set_per_process_memory_fraction": cuda_api.set_per_process_memory_fraction,
        "ipc_collect": lambda: None,
        "is_initialized": lambda: True,
        "is_current_stream_capturing": graphs.is_current_stream_capturing,
        "init": lambda: None,
        "_lazy_init": lambda: None,
        "memory_allocated": _mem("memory_allocated"),
        "max_memory_allocated": _mem("max_memory_allocated"),
        "memory_reserved": _mem("memory_reserved"),
        "max_memory_reserved": _mem("max_memory_reserved"),
        "memory_cached": _mem("memory_reserved"),
        "reset_peak_memory_stats": _mem("reset_peak_memory_stats"),
        "reset_max_memory_allocated": _mem("reset_peak_memory_stats"),
        "empty_cache": lambda: _empty_caches(emu),
        "mem_get_info": cuda_api.mem_get_info,
        "memory_stats": cuda_api.memory_stats,
        "memory_summary": cuda_api.memory_summary,
        "reset_accumulated_memory_stats": cuda_api.reset_accumulated_memory_stats,
        "_record_memory_history": cuda_api.record_memory_history,
        "memory_snapshot": cuda_api.memory_snapshot,
    }


# Note [FSDP2]: FSDP2's fully_shard turns parameters into DTensors over the local shards. torch builds a DTensor in
# C++ (`Tensor._dtensor__new__`) from the local tensor's C++ device, and ours is a meta-backed wrapper whose `cuda:N`
# is a Python property (EmuTensor.device), so every DTensor over an emulated shard said `meta`: training stopped in
# FSDP's lazy init with "FSDP parameters should be materialized from meta device" (an explicit `mesh=`; the default
# mesh, before torch._C._get_accelerator was patched, died earlier in a set_data of parameters it meant to move to
# the CPU, and until session 15 fully_shard raised a GpemuError naming the limit). On a GPU a DTensor is on its
# local tensor's device, so DTensor's `device` / `is_cuda` / `is_meta` / `get_device` answer from an emulated local
# tensor (other DTensors keep torch's answers); its ops already unwrap to the local EmuTensors, which are priced and
# queued as usual. Patched when a one-rank NCCL group is created (a DTensor needs a mesh over one), not at install:
# importing torch.distributed.tensor costs ~0.3 s. With it fully_shard on one rank trains (pytorch/torchtitan's
# FSDP2 idiom: per-block fully_shard, MixedPrecisionPolicy bf16, checkpoint_wrapper, per-block compile).
def _get_accelerator(check: Any = None) -> torch.device:
    """torch._C._get_accelerator under emulation: CUDA (FSDP2's default mesh, barrier; Note [FSDP2])."""
    return torch.device("cuda")


def _dtensor_property(name: str) -> property:
    """DTensor.<name> answering from an emulated local tensor, else torch's own (Note [FSDP2])."""
    orig = getattr(torch.Tensor, name)

    def get(self: Any) -> Any:
        local = getattr(self, "_local_tensor", None)
        if isinstance(local, EmuTensor):
            return getattr(local, name)
        return orig.__get__(self)

    return property(get)


def patch_dtensor(patcher: Patcher) -> None:
    """Make DTensors over emulated local tensors report the emulated device (Note [FSDP2]); once per patcher."""
    from torch.distributed.tensor import DTensor

    if "device" in DTensor.__dict__:
        return
    for name in ("device", "is_cuda", "is_meta"):
        patcher.set(DTensor, name, _dtensor_property(name))
    torch_get_device = torch.Tensor.get_device

    def get_device(self: Any) -> int:
        local = getattr(self, "_local_tensor", None)
        return local.get_device() if isinstance(local, EmuTensor) else torch_get_device(self)  # type: ignore[no-any-return]

    patcher.set(DTensor, "get_device", get_device)


def _distinct(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return a new function object that calls `fn` (Note [Distinct accelerator functions])."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


# Note [Distinct accelerator functions]: Dynamo builds its table of special-cased torch functions keyed by function
# object and asserts that no key is registered twice; it registers torch.accelerator.current_stream next to
# torch.cuda.current_stream, and torch.accelerator.synchronize next to torch.cuda.synchronize. gpemu had installed
# the same object under both names, so the first Dynamo trace under emulation (torch._dynamo.explain, torch.export,
# a CPU function given to Dynamo) died with "AssertionError: Handler already registered for <function
# current_stream>" (pytorch/tutorials torch_compile_tutorial.py). Every torch.accelerator replacement is its own
# function object.
def accelerator_functions(emu: state.Emulation) -> dict[str, Any]:
    """Return the torch.accelerator attributes gpemu replaces, by name (Note [Distinct accelerator functions])."""
    shared: dict[str, Any] = {
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": lambda: len(emu.devices),
        "current_device_index": emu.current_device,
        "current_device_idx": emu.current_device,
        "set_device_index": lambda device: emu.set_device(cuda_api.device_index(device)),
        "set_device_idx": lambda device: emu.set_device(cuda_api.device_index(device)),
        "synchronize": _synchronize,
        "current_stream": cuda_api.current_stream,
        "set_stream": cuda_api.set_stream,
        "device_index": cuda_api.DeviceContext,
        "empty_cache": lambda: _empty_caches(emu),
        "memory_allocated": _mem("memory_allocated"),
        "max_memory_allocated": _mem("max_memory_allocated"),
        "memory_reserved": _mem("memory_reserved"),
        "max_memory_reserved": _mem("max_memory_reserved"),
        "reset_peak_memory_stats": _mem("reset_peak_memory_stats"),
        "reset_accumulated_memory_stats": cuda_api.reset_accumulated_memory_stats,
        "memory_stats": cuda_api.memory_stats,
        "get_memory_info": accelerator_api.get_memory_info,
        "get_device_capability": accelerator_api.get_device_capability,
        "empty_host_cache": accelerator_api.empty_host_cache,
        "Graph": graphs.AcceleratorGraph,  # Note [CUDA graphs] in gpemu/device/graph.py
    }
    return {name: fn if isinstance(fn, type) else _distinct(fn) for name, fn in shared.items()}


def apply(emu: state.Emulation, patcher: Patcher) -> None:
    """Install every torch patch for `emu` through `patcher`."""
    for name, fn in cuda_functions(emu).items():
        patcher.set(torch.cuda, name, fn)
    import torch.cuda.memory as cuda_memory

    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "reset_peak_memory_stats", "empty_cache", "mem_get_info", "memory_stats", "memory_summary",
                 "reset_accumulated_memory_stats", "_record_memory_history", "memory_snapshot",
                 "get_per_process_memory_fraction", "set_per_process_memory_fraction", "caching_allocator_alloc",
                 "caching_allocator_delete", "list_gpu_processes"):
        if hasattr(cuda_memory, name):
            patcher.set(cuda_memory, name, getattr(torch.cuda, name))
    if hasattr(torch, "accelerator"):
        accelerator_memory = getattr(torch.accelerator, "memory", None)
        for name, fn in accelerator_functions(emu).items():
            if hasattr(torch.accelerator, name):
                patcher.set(torch.accelerator, name, fn)
            if accelerator_memory is not None and hasattr(accelerator_memory, name):
                patcher.set(accelerator_memory, name, fn)  # torch.accelerator.memory.memory_stats(...) too
    if hasattr(torch._C, "Stream") and hasattr(torch._C, "Event"):  # Note [Device-generic streams and events]
        patcher.set(torch, "Stream", accelerator_api.generic_stream(torch._C.Stream))
        patcher.set(torch, "Event", accelerator_api.generic_event(torch._C.Event))
    if hasattr(torch._C, "_get_accelerator"):  # the C++ query torch's own code asks (barrier, FSDP's device choice)
        patcher.set(torch._C, "_get_accelerator", _get_accelerator)
    T = torch.Tensor
    for name, make in (("to", _patched_to), ("cuda", _patched_cuda), ("pin_memory", _patched_pin_memory),
                       ("is_pinned", _patched_is_pinned), ("tolist", _patched_tolist), ("numpy", _patched_numpy),
                       ("record_stream", _patched_record_stream), ("new_tensor", _patched_new_tensor),
                       ("type_as", _patched_type_as), ("isfinite", _patched_isfinite),
                       ("as_subclass", _patched_as_subclass)):
        patcher.set(T, name, make(getattr(T, name)))
    import torch.distributed as dist

    if dist.is_available():
        patcher.set(dist, "init_process_group", _patched_init_process_group(dist.init_process_group, patcher))
        import torch.distributed.distributed_c10d as c10d

        patcher.set(c10d, "init_process_group", dist.init_process_group)
    ddp = torch.nn.parallel.DistributedDataParallel
    patcher.set(ddp, "__init__", _patched_ddp_init(ddp.__init__))
    if dist.is_available():  # Note [DDP on one rank] in gpemu/distributed/ddp.py
        import torch.nn.parallel.distributed as ddp_mod

        from gpemu.distributed import ddp as emulated_ddp

        patcher.set(dist.Reducer, "_rebuild_buckets", emulated_ddp.patched_rebuild_buckets(dist.Reducer._rebuild_buckets))
        patcher.set(ddp_mod, "_verify_param_shape_across_processes",
                    emulated_ddp.patched_verify_param_shapes(ddp_mod._verify_param_shape_across_processes))
    constructors = default_device.original_constructors()  # before the factories are patched: the originals
    route: dict[Any, Callable[..., Any]] = {}
    for name in _FILL_FACTORIES + _EMPTY_FACTORIES + _HOST_FACTORIES:
        if hasattr(torch, name):
            orig = getattr(torch, name)
            route[orig] = _patched_factory(name, orig)
            patcher.set(torch, name, route[orig])
    default_device.apply(patcher, constructors, route)
    patcher.set(torch, "Generator", rng.Generator)
    import torch.cuda.random as cuda_random

    for name in rng.RNG_NAMES:  # `torch.cuda.random.*` and `from torch.cuda.random import ...` users
        if hasattr(cuda_random, name):
            patcher.set(cuda_random, name, getattr(torch.cuda, name))
    legacy.apply(patcher)
    graphs.apply(patcher)
    vision_io.apply(patcher)  # Note [nvJPEG]
    nvml.apply(patcher)  # Note [Emulated NVML]
    nvtx.apply(patcher)  # Note [NVTX without a CUDA build]
    with patcher.optional("torch.profiler's CUDA activity"):  # Note [Older torch releases] in emulation.py
        profiling.apply(patcher)
    serialization.apply(patcher)
    # optimizers pick their foreach (multi-tensor) path only for these exact types; see Note [Foreach on emulated]
    import torch.optim.optimizer as optim_mod

    if hasattr(optim_mod, "_foreach_supported_types"):
        patcher.set(optim_mod, "_foreach_supported_types", [*optim_mod._foreach_supported_types, EmuTensor])
    import torch.utils._foreach_utils as fu

    if hasattr(fu, "_foreach_supported_types"):
        patcher.set(fu, "_foreach_supported_types", [*fu._foreach_supported_types, EmuTensor])
    if hasattr(fu, "_device_has_foreach_support"):
        import torch.nn.utils.clip_grad as clip_grad

        has_support = _foreach_device_check(fu._device_has_foreach_support)
        patcher.set(fu, "_device_has_foreach_support", has_support)
        if hasattr(clip_grad, "_device_has_foreach_support"):  # imported by name there
            patcher.set(clip_grad, "_device_has_foreach_support", has_support)
    patcher.set(torch, "compile", _eager_compile)
    patcher.set(torch, "ctc_loss", _ctc_loss_with_host_lengths(torch.ctc_loss))
    patcher.set(torch, "isfinite", _patched_isfinite(torch.isfinite))
    import torch.backends.mha as mha

    if hasattr(mha, "get_fastpath_enabled"):  # See Note [Transformer fast path]
        patcher.set(mha, "get_fastpath_enabled", lambda: False)
    if hasattr(torch.nn.Module, "compile"):
        patcher.set(torch.nn.Module, "compile", _eager_module_compile)
    hf_generate.apply(patcher)  # Note [Beam search under emulation]
    cpp_extension.apply(patcher)  # Note [CUDA extensions under emulation]
    flex_attention.apply(patcher)  # Note [FlexAttention]
    patcher.on_restore(install_meta_equal())  # Note [Equal on internal meta tensors] in ops.py


def _ctc_loss_with_host_lengths(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Return torch.ctc_loss that passes CPU length tensors as lists, as torch's own path for plain tensors does
    (Note [Tensors on two devices] in tensor.py: its subclass path divides the device losses by the CPU lengths)."""

    @functools.wraps(orig)
    def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, *args: Any,
                 **kwargs: Any) -> Any:
        if isinstance(log_probs, EmuTensor) and all(
                type(t) is torch.Tensor and t.device.type == "cpu" for t in (input_lengths, target_lengths)):
            input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
        return orig(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

    return ctc_loss


def _foreach_device_check(orig: Any) -> Any:
    """Return torch's `_device_has_foreach_support` that also accepts `meta` (the C++ device of EmuTensors)."""

    def has_foreach_support(device: torch.device) -> bool:
        return device.type == "meta" or bool(orig(device))

    return has_foreach_support


# Note [Foreach on emulated]: torch takes its multi-tensor (foreach) kernels only for tensors whose type is exactly
# torch.Tensor (`_foreach_supported_types`) on a device in its list. EmuTensor is added to the types; and the device
# torch sees after grouping tensors in C++ (`_group_tensors_by_device_and_dtype`) is `meta`, so `meta` is accepted
# too: `clip_grad_norm_` then runs `_foreach_norm` as on a GPU (and `foreach=True` no longer raises "can't use the
# foreach API on meta tensors"). Real meta tensors have foreach meta kernels, so accepting meta is harmless.


# Note [Transformer fast path]: in eval mode without grad, nn.MultiheadAttention, nn.TransformerEncoderLayer and
# nn.TransformerEncoder take a "fast path": one fused op per layer (`_transformer_encoder_layer_fwd`,
# `_native_multi_head_attention`) and, with a padding mask, nested tensors (`_nested_tensor_from_mask`, which has no
# meta kernel: the eval step failed). The fused ops have no cost model of their own (a 1024-wide layer on 32x512
# tokens was priced 0.2 ms instead of ~20 ms), so under emulation torch.backends.mha.get_fastpath_enabled() answers
# False and eval runs the standard path (linear, SDPA, layer_norm), priced op by op. A real GPU's fast path is somewhat
# faster than that (fused kernels, padding skipped by nested tensors).


# Note [torch.compile under emulation]
# Dynamo/Inductor trace real device kernels (Triton for CUDA); they cannot compile for an emulated device whose C++
# backing is meta. Scripts that call torch.compile (nanoGPT and most recent LLM trainers do by default) therefore run
# eager: the compiled object is the module/function itself. A compiled module is marked, and its steps price the
# streaming ops as Inductor's fused kernels, with no profile calibration (Note [Compiled regions] in fusion.py); a
# compiled function runs and is priced eager. A notice says so once per process.
_compile_notice_shown = False


def _eager_compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Return `model` unchanged, marked as compiled when it is a module (or a decorator that returns its function
    unchanged): torch.compile runs eager under emulation (Note [Compiled regions] in fusion.py)."""
    global _compile_notice_shown
    if not _compile_notice_shown:
        _compile_notice_shown = True
        import sys

        print("gpemu: torch.compile runs eager on the emulated GPU; a compiled module's elementwise, norm and "
              "reduction ops are priced as Inductor's fused kernels (docs/drop-in.md)", file=sys.stderr)
    if model is None:
        return lambda fn: _eager_compile(fn, *args, **kwargs)
    if isinstance(model, torch.nn.Module):
        model.__dict__["_gpemu_compiled"] = True  # not Module.__setattr__: a plain flag, no registration
        if compiles_cuda_graphs(kwargs):
            model.__dict__["_gpemu_cudagraphs"] = True
    return model


# Note [Compiled with CUDA graphs]: torch.compile's mode="reduce-overhead" (and "max-autotune", and
# options={"triton.cudagraphs": True}, and backend="cudagraphs") replays the compiled region through CUDA graph trees:
# after a warm-up call, the region's kernels run from one graph launch, without the host's dispatch between them. A
# recognised model's phase target (measured or predicted) holds that dispatch, so a module compiled so is priced per
# op (its streaming ops fused as Inductor's kernels: Note [Compiled regions] in fusion.py) with no phase target, as a
# captured CUDA graph is (Note [Phases and CUDA graphs] in phases.py). The emulator's own host time per call (module
# replay: ~1 ms a step) still delays launches: tiny-kernel loops read slower than a GPU's graph replay would.
def compiles_cuda_graphs(kwargs: dict[str, Any]) -> bool:
    """Return True when torch.compile's arguments ask for CUDA graphs (Note [Compiled with CUDA graphs])."""
    options = kwargs.get("options") or {}
    return (kwargs.get("mode") in ("reduce-overhead", "max-autotune") or kwargs.get("backend") == "cudagraphs"
            or bool(isinstance(options, dict) and options.get("triton.cudagraphs")))


def _eager_module_compile(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    """nn.Module.compile under emulation: mark the module compiled, run it eager (Note [Compiled regions])."""
    _eager_compile(self, *args, **kwargs)


def _empty_caches(emu: Any) -> None:
    """Release every emulated device's cached, unallocated memory (torch.cuda.empty_cache)."""
    for device in emu.devices:
        device.allocator.empty_cache()
