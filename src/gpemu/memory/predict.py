"""Memory prediction without a GPU: simulate training steps on meta tensors against the caching-allocator model."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from gpemu.device.allocator import MIB, CachingAllocator, EmulatedOutOfMemoryError
from gpemu.errors import GpemuError, UnknownNameError
from gpemu.hardware import GPUSpec, get_gpu
from gpemu.memory.autograd_compat import cuda_dropout, cuda_sdpa, legacy_hardtanh
from gpemu.memory.tracker import MemoryTracker
from gpemu.memory.workspaces import CUBLAS_THREADS, cublas_workspace_bytes, ensure_cublas_workspace

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}

# Note [GPEmu memory semantics]
# GPEmu's memory.csv (../shared/data/gpemu-profiles/memory) records, per batch size, `peak` = the largest
# torch.cuda.memory_allocated during one training iteration and `persistent` = memory_allocated after it. An
# iteration is forward, then loss + optimizer.zero_grad() + backward + SGD-with-momentum step. The data say:
# - persistent ~= 3 x parameters + one input batch (alexnet B=1: 3 * 233.08 MiB + 0.57 MiB = 699.8 MiB vs 700.2
#   measured), so gradients survive the iteration: zero_grad() before backward (torch 1.x default
#   set_to_none=False, or set_to_none=True followed by backward re-creating them; both leave grads allocated);
# - the cuBLAS workspace is not in memory_allocated (it would add 8 MiB to alexnet's persistent): that torch
#   (1.x) let cuBLAS allocate it outside the caching allocator. Modern torch allocates it through the caching
#   allocator (see gpemu.memory.workspaces); predict_memory(..., cublas_workspace=True) models that.
# - the input batch (B x 3 x 224 x 224 fp32) and labels live on the GPU during and after the iteration; the loop
#   variables `output` and `loss` of the last iteration stay alive after it.
# - in-place ReLU6/Hardtanh save their result, not a copy of their input (torch <= 1.9; mobilenet_v2 is 44% over
#   otherwise): see Note [hardtanh_ saves a copy of its input] in gpemu.memory.autograd_compat.


@dataclass(frozen=True)
class StepMemory:
    """Memory of a simulated training loop (bytes, steady-state iteration)."""

    peak_bytes: int  # max memory_allocated during the last iteration
    persistent_bytes: int  # memory_allocated after the last iteration
    reserved_peak_bytes: int  # max memory_reserved over the whole run
    parameter_bytes: int
    batch_bytes: int
    top_tags: dict[str, int]  # live bytes by tag at the end (parameters, grads, optimizer state, batch, ...)


def build_workload(
    workload: str, batch_size: int, dtype: str = "fp32", source: str = "zoo"
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Return (model, (inputs, labels)) on the meta device: from gpemu's zoo, or torchvision's defaults.

    source="torchvision" builds `torchvision.models.get_model(name, weights=None)` exactly (googlenet keeps its
    auxiliary classifiers, as GPEmu's measurements did); source="zoo" uses gpemu.workloads.models.
    """
    if dtype in ("amp", "amp_bf16", "tf32"):
        if dtype == "tf32":  # TF32 changes the math, not the storage: memory is fp32's
            return build_workload(workload, batch_size, "fp32", source)
        raise GpemuError(f"build_workload cannot express dtype {dtype!r} (autocast) as a meta model: use "
                         "predict_memory(), which simulates autocast through the drop-in emulation")
    if dtype not in _DTYPES:
        raise UnknownNameError("dtype", dtype, _DTYPES)
    torch_dtype = _DTYPES[dtype]
    try:
        with torch.device("meta"):
            model, batch = _build_zoo(workload, batch_size, source)
    except NotImplementedError:  # See Note [Constructors that read tensors]
        model, batch = _build_zoo(workload, batch_size, source)
    model = model.to(device="meta", dtype=torch_dtype)
    batch = tuple(b.to("meta", torch_dtype) if b.is_floating_point() else b.to("meta") for b in batch)
    return model, batch


# Note [Constructors that read tensors]
# The model is built under torch.device("meta") so no weights are initialised. A constructor that computes its
# shape from tensors and reads them back (torchvision's RegNets: block widths from torch.pow / torch.round and
# .tolist()) cannot run there ("Cannot copy out of meta tensor"): predict_memory failed for every RegNet (session 12,
# against the H200's measured memory rows). Such a model is built on the host and moved to meta.
def _build_zoo(workload: str, batch_size: int, source: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if source not in ("zoo", "torchvision"):
        raise UnknownNameError("model source", source, ["zoo", "torchvision"])
    with contextlib.suppress(ImportError, AttributeError):
        if source != "zoo":
            raise ImportError
        from gpemu.workloads import models as zoo  # written by the workloads helper

        model = zoo.build_model(workload)
        batch = zoo.example_batch(workload, batch_size, device="meta")
        return model, tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    import torchvision

    names = torchvision.models.list_models()
    if workload not in names:
        raise UnknownNameError("model", workload, names)
    kwargs: dict[str, object] = {"weights": None}
    if workload in ("googlenet", "inception_v3"):
        kwargs["init_weights"] = False  # scipy-free init; memory does not depend on values (aux_logits stays on)
    model = torchvision.models.get_model(workload, **kwargs)
    size = 299 if workload == "inception_v3" else 224
    images = torch.empty(batch_size, 3, size, size, device="meta")
    labels = torch.empty(batch_size, dtype=torch.long, device="meta")
    return model, (images, labels)


@contextlib.contextmanager
def _module_tags(model: nn.Module, tracker: MemoryTracker, phase: str) -> Iterator[None]:
    """Tag allocations with the innermost running module while the model runs."""
    handles = []
    stack: list[str] = []

    def pre(name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            stack.append(name)
            tracker.tag = f"{phase}: {name}"

        return hook

    def post(*_: object) -> None:
        if stack:
            stack.pop()
        tracker.tag = f"{phase}: {stack[-1]}" if stack else phase

    for name, module in model.named_modules():
        if not list(module.children()):  # leaves only: cheap and precise
            handles.append(module.register_forward_pre_hook(pre(name or type(model).__name__)))
            handles.append(module.register_forward_hook(post))
    tracker.tag = phase
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _charge_model_and_batch(model: nn.Module, batch: tuple[torch.Tensor, ...], allocator: CachingAllocator,
                            cublas_workspace: int) -> tuple[MemoryTracker, int, int]:
    """Charge a meta model's parameters and buffers, then its input batch (model.cuda(), then the batch copy); return
    the tracker, the model's bytes and the batch's bytes."""
    tracker = MemoryTracker(allocator, cublas_workspace_bytes=cublas_workspace)
    tracker.track(list(model.parameters()), tag="parameters")
    tracker.track(list(model.buffers()), tag="buffers")
    parameter_bytes = allocator.memory_allocated()
    tracker.track(list(batch), tag="input batch")
    return tracker, parameter_bytes, allocator.memory_allocated() - parameter_bytes


def simulate_training(
    model: nn.Module,
    batch: tuple[torch.Tensor, ...],
    allocator: CachingAllocator,
    iterations: int = 3,
    set_to_none: bool = True,
    cublas_workspace: int = 0,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    hardtanh_inplace_clone: bool = True,
    compute_capability: tuple[int, int] = (8, 0),
) -> StepMemory:
    """Run `iterations` SGD-momentum training steps of a meta-device model, charging memory to `allocator`.

    The model and batch must live on `meta`; their storages are charged first (model.cuda(), then the batch copy).
    hardtanh_inplace_clone=True keeps the installed torch's autograd (>= 1.10: hardtanh_ saves a copy of its input);
    False applies torch <= 1.9's rule, which GPEmu's data follow. See Note [GPEmu memory semantics].
    Dropout and attention run the fused CUDA kernels a GPU of `compute_capability` would (1-byte dropout masks; flash
    or memory-efficient attention without a stored score matrix).
    """
    tracker, parameter_bytes, batch_bytes = _charge_model_and_batch(model, batch, allocator, cublas_workspace)
    params = list(model.parameters())
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    *inputs, target = batch
    model.train()
    output: object = None
    loss: torch.Tensor | None = None
    peak = 0
    with tracker, contextlib.ExitStack() as stack:
        if not hardtanh_inplace_clone:
            stack.enter_context(legacy_hardtanh())
        stack.enter_context(cuda_dropout())
        stack.enter_context(cuda_sdpa(compute_capability))
        for _ in range(iterations):
            allocator.reset_peak_memory_stats()
            with _module_tags(model, tracker, "forward"):
                output = model(*inputs)
            tracker.tag = "loss"
            logits = _first_tensor(output)
            loss = loss_fn(logits, target)
            tracker.tag = "backward"
            optimizer.zero_grad(set_to_none=set_to_none)
            loss.backward()
            tracker.tag = "optimizer"
            optimizer.step()
            peak = allocator.max_memory_allocated()
        persistent = allocator.memory_allocated()
        tags = _group_tags(allocator.allocated_by_tag())
        reserved_peak = allocator.max_memory_reserved()
        del output, loss, logits
    return StepMemory(peak, persistent, reserved_peak, parameter_bytes, batch_bytes, tags)


# Note [Inference memory]: an inference forward (model.eval() under torch.no_grad(), Note [Inference forward] in
# workloads/optrace.py) holds the weights, the input batch and, at any moment, only the activations still to be
# read: no autograd graph keeps a layer's output alive after its consumer ran, so the peak is the weights plus the
# largest set of live activations (a residual branch's input while the branch runs), not the sum over layers that a
# training forward saves for its backward. simulate_inference runs that forward on meta through the same caching-
# allocator model; the output is dropped after each iteration, as an evaluation loop does after reading it.
def simulate_inference(
    model: nn.Module,
    batch: tuple[torch.Tensor, ...],
    allocator: CachingAllocator,
    iterations: int = 2,
    cublas_workspace: int = 0,
    compute_capability: tuple[int, int] = (8, 0),
) -> StepMemory:
    """Run `iterations` inference forwards (eval mode, no_grad) of a meta-device model, charging memory to `allocator`
    (Note [Inference memory]); the batch's last tensor (the target) is charged but not used."""
    tracker, parameter_bytes, batch_bytes = _charge_model_and_batch(model, batch, allocator, cublas_workspace)
    *inputs, _target = batch
    model.eval()
    peak = 0
    with tracker, torch.no_grad(), contextlib.ExitStack() as stack:
        stack.enter_context(cuda_sdpa(compute_capability))
        for _ in range(iterations):
            allocator.reset_peak_memory_stats()
            with _module_tags(model, tracker, "forward"):
                output = model(*inputs)
            del output
            peak = allocator.max_memory_allocated()
        persistent = allocator.memory_allocated()
        tags = _group_tags(allocator.allocated_by_tag())
        reserved_peak = allocator.max_memory_reserved()
    return StepMemory(peak, persistent, reserved_peak, parameter_bytes, batch_bytes, tags)


def _first_tensor(output: object) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits  # type: ignore[no-any-return]
    if isinstance(output, (tuple, list)):
        return _first_tensor(output[0])
    if isinstance(output, dict):
        return _first_tensor(next(iter(output.values())))
    raise TypeError(f"cannot find the logits in a model output of type {type(output).__name__}")


def _group_tags(by_tag: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for tag, size in by_tag.items():
        key = tag or "untagged"
        out[key] = out.get(key, 0) + size
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:10])


def new_allocator(gpu: GPUSpec | str, memory_limit_bytes: int | None = None) -> CachingAllocator:
    """Return a fresh CachingAllocator with the capacity and CUDA context of a GPU (or a memory limit)."""
    spec = get_gpu(gpu)
    capacity = memory_limit_bytes if memory_limit_bytes is not None else spec.memory_bytes
    return CachingAllocator(capacity, int(spec.context_mib * MIB))


@functools.lru_cache(maxsize=256)
def _simulate_cached(
    gpu_key: str, workload: str, batch_size: int, dtype: str, iterations: int, set_to_none: bool,
    cublas_workspace: bool, capacity_bytes: int | None, source: str = "zoo", hardtanh_inplace_clone: bool = False,
    mode: str = "train",
) -> StepMemory:
    spec = get_gpu(gpu_key)
    if dtype in AUTOCAST_DTYPES:
        return _simulate_autocast(spec, workload, batch_size, dtype, iterations, set_to_none, capacity_bytes, mode,
                                  cublas_workspace)
    allocator = new_allocator(spec, capacity_bytes)
    model, batch = build_workload(workload, batch_size, dtype, source)
    workspace = cublas_workspace_bytes(spec) if cublas_workspace else 0
    if mode == "infer":  # Note [Inference memory]
        return simulate_inference(model, batch, allocator, iterations, workspace,
                                  tuple(spec.compute_capability))  # type: ignore[arg-type]
    return simulate_training(model, batch, allocator, iterations, set_to_none, workspace, _zoo_loss(workload),
                             hardtanh_inplace_clone, tuple(spec.compute_capability))  # type: ignore[arg-type]


AUTOCAST_DTYPES = {"amp": torch.float16, "amp_bf16": torch.bfloat16}
# Note [cuBLAS workspaces in the autocast simulation]
# The fp32 simulation charges cuBLAS's per-thread workspaces on the first GEMM (Note [Library workspaces]); the drop-in
# emulation that simulates autocast does not allocate them, so an AMP prediction was 2 x 32 MiB short on Hopper: the
# H200 (bench/heldout_memory_validation.py) measured resnet50's AMP persistent memory at 363.7 MiB at batch 1 where
# gpemu said 300.5 (fp32: 363.2 measured, 363.3 predicted). A model with GEMM layers now has them allocated up front
# (the forward thread's, and autograd's for training): by the end of a step a GPU has both either way.
# what the drop-in's allocation tags (the op that made each storage) hold after a step of _simulate_autocast
_DROPIN_TAGS = {"h2d": "parameters", "torch.randn": "input batch", "torch.randint": "input batch",
                "aten.clone.default": "optimizer", "aten._to_copy.default": "gradients"}


def _simulate_autocast(spec: GPUSpec, workload: str, batch_size: int, dtype: str, iterations: int,
                       set_to_none: bool, capacity_bytes: int | None, mode: str = "train",
                       cublas_workspace: bool = True) -> StepMemory:
    """Memory of autocast training (fp32 weights, gradients and optimizer state; 16-bit activations and autocast's
    weight copies), run through the drop-in emulation: zoo model .cuda(), torch.autocast + GradScaler, SGD-momentum.

    See Note [Autocast casts take memory] in torch_backend/autocast.py for what the casts hold and when they go.
    """
    import gpemu.torch_backend as gt
    from gpemu.workloads import models as zoo

    if gt.current_emulation() is not None:
        raise GpemuError("autocast memory is simulated through the drop-in emulation, which is already installed in "
                         "this process: call predict_memory(dtype='amp') from a process without gpemu.install()")
    # capacity_bytes: the device's (fits) or "unlimited" (predict_memory answers past the device's memory, as the
    # fp32 path does; before session 11 this path fell back to the device's capacity and raised its OOM instead)
    emu = gt.install(spec.key, memory_limit_bytes=capacity_bytes or None, replay=False)
    emu.cublas_workspace = cublas_workspace
    try:
        alloc = emu.devices[0].allocator
        model = zoo.build_model(workload)
        model.cuda()
        parameter_bytes = alloc.memory_allocated()
        inputs, target = zoo.example_batch(workload, batch_size, device="cuda")
        batch_bytes = alloc.memory_allocated() - parameter_bytes
        if (cublas_workspace and cublas_workspace_bytes(spec) > 0
                and any(isinstance(m, (nn.Linear, nn.MultiheadAttention)) for m in model.modules())):
            # See Note [cuBLAS workspaces in the autocast simulation]
            stream_id = emu.current_stream(0).stream_id
            for thread in CUBLAS_THREADS[:1] if mode == "infer" else CUBLAS_THREADS:
                ensure_cublas_workspace(alloc, stream_id, cublas_workspace_bytes(spec), thread)
        if mode == "infer":  # Note [Inference memory]
            model.eval()
            for _ in range(iterations):
                alloc.reset_peak_memory_stats()
                with torch.no_grad(), torch.autocast("cuda", dtype=AUTOCAST_DTYPES[dtype]):
                    out = model(inputs)
                del out
            return StepMemory(alloc.max_memory_allocated(), alloc.memory_allocated(), alloc.max_memory_reserved(),
                              parameter_bytes, batch_bytes, _group_tags(alloc.allocated_by_tag()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
        scaler = torch.amp.GradScaler("cuda")
        model.train()
        for _ in range(iterations):
            alloc.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=AUTOCAST_DTYPES[dtype]):
                loss = zoo.loss_fn(workload, _first_tensor(model(inputs)), target)
            optimizer.zero_grad(set_to_none=set_to_none)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            del loss
        tags: dict[str, int] = {}
        for tag, nbytes in _group_tags(alloc.allocated_by_tag()).items():
            name = _DROPIN_TAGS.get(tag, tag)
            tags[name] = tags.get(name, 0) + nbytes
        return StepMemory(alloc.max_memory_allocated(), alloc.memory_allocated(), alloc.max_memory_reserved(),
                          parameter_bytes, batch_bytes, tags)
    finally:
        gt.uninstall()


def _zoo_loss(workload: str) -> Callable[..., torch.Tensor] | None:
    try:
        from gpemu.workloads import models as zoo
    except ImportError:
        return None
    loss = getattr(zoo, "loss_fn", None)
    return functools.partial(loss, workload) if loss is not None else None


# The torch of GPEmu's published measurements (<= 1.9): model.zero_grad() kept gradients (set_to_none=False), no
# cuBLAS workspace went through the caching allocator, and in-place hardtanh_ saved its result. Use it to validate
# against ../shared/data; use the defaults (the installed torch) for predictions.
GPEMU_DATA_SEMANTICS: dict[str, bool] = {"set_to_none": False, "cublas_workspace": False, "hardtanh_inplace_clone": False}


def predict_memory(
    gpu: GPUSpec | str,
    workload: str,
    batch_size: int,
    dtype: str = "fp32",
    iterations: int = 3,
    set_to_none: bool = True,
    cublas_workspace: bool = True,
    source: str = "zoo",
    hardtanh_inplace_clone: bool = True,
    mode: str = "train",
) -> dict[str, object]:
    """Return {peak_mib, persistent_mib, reserved_peak_mib, source, ...} for one training iteration (mode "infer": one
    inference forward, Note [Inference memory]), without a GPU.

    Simulated with unlimited capacity (so it answers even when the batch would not fit); see max_batch_size().
    Defaults follow the installed torch (>= 2.0: zero_grad(set_to_none=True), cuBLAS workspace in the caching
    allocator, in-place hardtanh_ saving a copy of its input); pass **GPEMU_DATA_SEMANTICS to model the older torch
    that GPEmu's published measurements were taken with (see docs/memory.md).
    """
    spec = get_gpu(gpu)
    if mode not in ("train", "infer"):
        raise UnknownNameError("mode", mode, ("train", "infer"))
    mem = _simulate_cached(spec.key, workload, batch_size, dtype, iterations, set_to_none, cublas_workspace, 1 << 60,
                           source, hardtanh_inplace_clone, mode)
    how = (f"simulated: {iterations} inference forwards (model.eval() under torch.no_grad()"
           f"{', autocast ' + dtype + ' through the drop-in emulation' if dtype in AUTOCAST_DTYPES else ''}) on gpemu's "
           "CUDA caching-allocator model (Note [Inference memory]); not validated against measurements")
    return {
        "peak_mib": mem.peak_bytes / MIB,
        "persistent_mib": mem.persistent_bytes / MIB,
        "reserved_peak_mib": mem.reserved_peak_bytes / MIB,
        "parameter_mib": mem.parameter_bytes / MIB,
        "batch_mib": mem.batch_bytes / MIB,
        "fits": mem.reserved_peak_bytes + spec.context_mib * MIB <= spec.memory_bytes,
        "top_allocations_mib": {k: v / MIB for k, v in mem.top_tags.items()},
        "source": how if mode == "infer" else (
            f"simulated: {iterations} autocast ({dtype}) SGD-momentum + GradScaler training steps through the drop-in "
            f"emulation's CUDA caching-allocator model (fp32 master weights and optimizer state, 16-bit activations "
            f"and autocast weight copies, zero_grad(set_to_none={set_to_none})); against an H200's measured AMP "
            "training steps (90 configurations of 27 models, batch 1-256, session 12: "
            "bench/heldout_memory_validation.py) peak median |error| 1.0 %, p90 10.4 %" if dtype in AUTOCAST_DTYPES else
            f"simulated: {iterations} SGD-momentum training steps on meta tensors through gpemu's CUDA "
            f"caching-allocator model ({dtype}, zero_grad(set_to_none={set_to_none}), "
            f"cuBLAS workspace {'on' if cublas_workspace else 'off'}, in-place hardtanh_ saves "
            f"{'a copy of its input' if hardtanh_inplace_clone else 'its result'})"
        ),
    }


def fits(
    gpu: GPUSpec | str,
    workload: str,
    batch_size: int,
    dtype: str = "fp32",
    memory_limit_bytes: int | None = None,
    set_to_none: bool = True,
    cublas_workspace: bool = True,
    source: str = "zoo",
    hardtanh_inplace_clone: bool = True,
) -> bool:
    """Return True when training `workload` at `batch_size` runs without OOM on the GPU (or a memory limit)."""
    spec = get_gpu(gpu)
    try:
        _simulate_cached(spec.key, workload, batch_size, dtype, 2, set_to_none, cublas_workspace,
                         memory_limit_bytes if memory_limit_bytes is not None else spec.memory_bytes, source,
                         hardtanh_inplace_clone)
    except EmulatedOutOfMemoryError:
        return False
    return True


def max_batch_size(
    gpu: GPUSpec | str,
    workload: str,
    dtype: str = "fp32",
    memory_limit_bytes: int | None = None,
    upper: int = 1 << 16,
    set_to_none: bool = True,
    cublas_workspace: bool = True,
    source: str = "zoo",
    hardtanh_inplace_clone: bool = True,
) -> int:
    """Return the largest batch size whose training step fits (0 when even batch 1 does not), by bisection."""

    def ok(b: int) -> bool:
        return fits(gpu, workload, b, dtype, memory_limit_bytes, set_to_none, cublas_workspace, source,
                    hardtanh_inplace_clone)

    if not ok(1):
        return 0
    # Guess from the (near-linear) growth of the unlimited-capacity peak, then bracket and bisect.
    spec = get_gpu(gpu)
    capacity = (memory_limit_bytes if memory_limit_bytes is not None else spec.memory_bytes) - spec.context_mib * MIB
    one = predict_memory(gpu, workload, 1, dtype, 2, set_to_none, cublas_workspace, source, hardtanh_inplace_clone)
    two = predict_memory(gpu, workload, 2, dtype, 2, set_to_none, cublas_workspace, source, hardtanh_inplace_clone)
    per_sample = max(float(two["reserved_peak_mib"]) - float(one["reserved_peak_mib"]), 1e-3) * MIB  # type: ignore[arg-type]
    guess = int(max(1, min(upper, 1 + (capacity - float(one["reserved_peak_mib"]) * MIB) / per_sample)))  # type: ignore[arg-type]
    lo, hi = 1, upper + 1  # ok(lo), not ok(hi)
    step = max(1, guess // 16)
    probe = guess
    if ok(probe):
        lo = probe
        while lo < upper:
            probe = min(upper, lo + step)
            if not ok(probe):
                hi = probe
                break
            lo, step = probe, step * 2
        else:
            return upper
    else:
        hi = probe
        while hi > 1:
            probe = max(1, hi - step)
            if ok(probe):
                lo = probe
                break
            hi, step = probe, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
