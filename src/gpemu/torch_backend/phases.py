"""Training phases and profile calibration: forward / backward(+optimizer) detection, model identification.

Note [Phase calibration]: a global module forward hook sees when the top module (the first module called with an
emulated tensor) starts and ends its forward. Ops inside it are the "forward" phase; ops after it until the next
forward are the GPEmu "backward" phase (loss + zero_grad + backward + optimizer.step). When the profile database
has (gpu, workload, phase, batch size, dtype), each op's predicted cost is multiplied by
profile_phase_s / predicted_phase_s, where predicted_phase_s is the sum of the same phase's predictions in the
previous step with the same (workload, batch size, dtype). So the first step runs on predictions and every step
after it sums to the profile, with the shape of the per-op predictions. Trace args say which ("calibrated" with
its scale, or "predicted"). Profiles stand for their input: an identified vision model fed anything but the zoo's
3x224x224 images (e.g. 64x64 crops) runs on per-op predictions, unless the user named the model (--model).

Note [Phase predictions]: when no measured profile exists for the emulated GPU but the model is one gpemu's zoo can
build (every torchvision classifier, identified by class name and parameter count), the phase target is
`gpemu.cost.predict_phase` -- the number `gpemu predict` prints: the nearest measured GPU's row scaled by the time
model's ratio ("scaled-from:<gpu>"), else the time model from the spec ("spec-model"). That number includes what a
sum of per-op kernel times leaves out (the host's dispatch time, which bounds small kernels on a fast GPU, and the
per-phase fixed costs) and is the one validated in bench/predict_validation.py. Trace args say "phase-predicted"
with the path. GPEMU_PHASE_PREDICT=0 turns it off (pure per-op predictions); it applies with the default profile
lookup only.

Note [Accumulation steps]: the backward phase's scale is its target over the same phase's per-op sum in an earlier
step, and with gradient accumulation consecutive phases differ: micro-steps run loss + backward only, the last one
also the optimizer step (and timm's gradient clipping and ModelEmaV2 update: ~1,300 small kernels for ResNet-50).
Scaled by the previous phase's sum, the stepping phase took a backward-only phase's scale (2.37 for ResNet-50 at
batch 32, amp, on an A100: its EMA update was charged at 2.4x its per-op price) and the next micro-step the reverse,
so timm's train.py with `--grad-accum-steps 2` alternated 22.6 / 67.4 ms of GPU per micro-step where each runs
14.4 + 21.1 ms of predicted forward and backward. Once a backward phase has run a backward pass without an optimizer
step (the loop accumulates), backward phases take their scale from such a phase's sum, and in a phase that steps the
optimizer the step and what follows it (clipping after unscale_ excepted: it comes before) are priced per op: every
micro-step's loss + backward sums to the target (which also covers one optimizer step), and the update is added once
per accumulation cycle. Loops that step after every backward are scaled as before (up to the step's end: Note
[Work after the step]).

Note [Work after the step]: the backward phase runs from the top module's return to its next call, and its target
covers the loss, the backward pass and one optimizer step, not what a loop does after the step. NVIDIA
DeepLearningExamples' ConvNets `--use-ema` (an EMA of every state_dict tensor: ~800 kernels for ResNet-50) and timm's
ModelEmaV2 update after `optimizer.step()`; scaled with the phase, their kernels were squeezed into the backward
target, so a step with an EMA read the same GPU time as one without (44.46 ms for ResNet-50 at batch 64, amp, on an
A100, either way) while with gradient accumulation the same update cost ~16 ms (Note [Accumulation steps]). When
the optimizer step returns after the phase's backward pass (not inside it: Note [Optimizer steps in backward] in
report/hooks.py; a step before any backward pass leaves the phase as it was), the phase is closed with its sum so
far, which becomes the next step's calibration sum, and what follows until the next forward (EMA updates, metrics,
the next batch's input preparation) is priced per op. A second optimizer stepped
after the first (one per sub-network) is then priced per op too.

Note [Frozen parameters]: profiles and phase predictions are full training steps: every parameter gets a gradient
and an update. Fine-tuning with a frozen backbone (`requires_grad = False` on all but the head: pytorch/tutorials
transfer_learning's "fixed feature extractor") runs the same forward but a backward of the head alone, and its
backward phase was scaled up to the whole network's (resnet18 at batch 4 on an A100: 9.5 ms predicted, for a few
kernels). When the top module has parameters that do not require grad, its backward phase stays on the per-op
predictions; the forward, the same layers either way, still takes the profile or prediction.

Note [Several forwards in a step]: a backward phase's target is one call's loss + backward + step, and it ran from the
top module's return to its next call. Self-supervised loops call the model several times before one backward pass:
DINO's MultiCropWrapper runs the backbone on the two 224x224 global crops, then on the 96x96 local crops (a frozen
teacher's call before both), SimCLR/BYOL on two views. The "backward phase" after the first call then held only the
`torch.cat` of the next crops, its sum became the calibration sum, and the next step charged that one cat the whole
backward prediction (ResNet-50 DINO, batch 8, amp, A100: a 20.0 ms `cat`, scale 1,970) while the real backward ran
per op after the last call: the phantom stood beside it. A grad-enabled forward-only loop (evaluation without
`no_grad`) did the same once per call. A training call that opens while the previous call's backward phase ran no
backward pass marks the step as split, and the keys of split steps keep their backward phases per op (the forwards
keep their targets: each is the profiled forward); a later one-forward step of the key (its phase runs a backward
pass and the step has no second call) frees the key again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpemu.torch_backend import state
from gpemu.torch_backend.fusion import FusionGroups, compiled_module, marked_compiled

PhaseLookup = Callable[[str, str, str, int, str], "float | None"]

_PREDICTED_ARGS: dict[str, object] = {"timing": "predicted"}
_CAPTURED_ARGS: dict[str, object] = {"timing": "predicted", "captured": True}  # Note [Phases and CUDA graphs]
_CACHE_MAX = 4096


def default_lookup(gpu_key: str, workload: str, phase: str, batch_size: int, dtype: str) -> float | None:
    """Return the profiled seconds of one phase from gpemu's ProfileDB, or None (also when it is unavailable)."""
    try:
        from gpemu.profiles import ProfileDB  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        est = ProfileDB.default().lookup(gpu_key, workload, phase, batch_size, dtype)
    except Exception:  # unknown workload/gpu or an unreadable DB: fall back to per-op predictions
        return None
    if est is None or not getattr(est, "ok", False):
        return None
    return float(est.value)


def predicted_phase(gpu_key: str, workload: str, phase: str, batch_size: int, dtype: str,
                    memory_format: str = "nchw") -> tuple[float, str] | None:
    """Return (seconds, path) of gpemu.cost.predict_phase for one phase, or None (see Note [Phase predictions])."""
    if os.environ.get("GPEMU_PHASE_PREDICT", "1") == "0" or phase not in ("forward", "backward", "inference"):
        return None
    try:
        from gpemu.cost.predict import predict_phase
        from gpemu.profiles import ProfileDB  # type: ignore[attr-defined]

        try:
            db = ProfileDB.default()
        except Exception:  # no or unreadable profiles: the spec model still answers
            db = None
        est = predict_phase(gpu_key, workload, phase, batch_size, dtype, db=db, memory_format=memory_format)
    except Exception:  # a model the zoo cannot build, an unknown dtype: stay on per-op predictions
        return None
    return float(est.value), str(est.path or "predicted")


@functools.cache
def _profiled_input(workload: str) -> tuple[int, ...] | None:
    """Return the per-sample input shape profiles and phase predictions of `workload` assume (None: unknown)."""
    try:
        from gpemu.workloads.models import example_batch, model_kind

        if model_kind(workload) != "vision":
            return None
        return tuple(example_batch(workload, 1, device="meta")[0].shape[1:])
    except Exception:  # not a zoo model: nothing to check against
        return None


def _input_matches(workload: str, batch: torch.Tensor) -> bool:
    """Return False when the step's input is not the one the workload's profiles were measured with (Note [Phase
    calibration]: GPEmu's rows and the zoo are 3x224x224 images; another resolution is another workload)."""
    expected = _profiled_input(workload)
    return expected is None or tuple(batch.shape[1:]) == expected


def _channels_last_step(module: torch.nn.Module, batch: torch.Tensor) -> bool:
    """Return True when the step runs in channels_last: its 4-D input batch or the model's first 4-D parameter (a
    conv weight after model.to(memory_format=torch.channels_last)) is strictly NHWC (Note [Memory format])."""
    from gpemu.cost.registry import tensor_layout

    if batch.dim() == 4 and tensor_layout(batch) == "nhwc":
        return True
    weight = next((p for p in module.parameters() if p.dim() == 4 and tensor_layout(p)), None)
    return weight is not None and tensor_layout(weight) == "nhwc"


def _replica_thread() -> bool:
    """Return True in a DataParallel replica thread (several emulated GPUs, not the main thread): phases are the
    main thread's; replicas run on per-op predictions (a profile is one GPU's step, not a slice of one)."""
    if threading.current_thread() is threading.main_thread():
        return False
    emu = state.current_emulation()
    return emu is not None and len(emu.devices) > 1


# ---- model identification ------------------------------------------------------------------------------------

_TV_PREFIX = {"resnet": ("resnet", "resnext", "wide_resnet"), "inception3": ("inception",), "visiontransformer": ("vit",)}


def _count_cache_path() -> Path | None:
    try:
        import torchvision

        from gpemu.paths import cache_dir
    except ImportError:
        return None
    return cache_dir() / f"torchvision-{torchvision.__version__}-param-counts-v2.json"


def _head_params(model: torch.nn.Module) -> int:
    """Return the parameter count of the classifier head: the last nn.Linear registered (torchvision's `fc`,
    `classifier[-1]`, `heads.head`, ...), or 0."""
    last = None
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            last = m
    return sum(p.numel() for p in last.parameters()) if last is not None else 0


@functools.cache
def _torchvision_param_counts(prefixes: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Return {torchvision model name: (parameter count, count without the head)} for names with these prefixes
    (cached on disk)."""
    try:
        import torchvision
    except ImportError:
        return {}
    path = _count_cache_path()
    cached: dict[str, list[int]] = {}
    if path is not None and path.exists():
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cached = {}
    counts: dict[str, tuple[int, int]] = {}
    dirty = False
    for name in torchvision.models.list_models(module=torchvision.models):
        if not name.startswith(prefixes):
            continue
        if name not in cached:
            from gpemu.workloads.optrace import build_on_meta

            try:  # on meta: no bytes, ~0.1-1 s per model; cached so a run pays it once. build_on_meta also builds the
                # RegNets, whose constructors compute their widths with tensors (torch.device("meta") alone failed)
                model = build_on_meta(name)
            except Exception:  # a builder that needs weights or arguments: not a candidate
                continue
            total = sum(p.numel() for p in model.parameters())
            cached[name] = [total, total - _head_params(model)]
            dirty = True
        counts[name] = (int(cached[name][0]), int(cached[name][1]))
    if dirty and path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cached, sort_keys=True), encoding="utf-8")
        except OSError:
            pass
    return counts


def identify_model(module: torch.nn.Module) -> str | None:
    """Return the torchvision model name of `module` or of the wrapper-free child holding all its parameters."""
    # Note [Wrapped models]: scripts often call a wrapper as "the model" -- DataParallel, a LightningModule holding
    # `self.model = resnet50()`, torch.compile's OptimizedModule, an EMA or task wrapper. When the wrapper owns no
    # parameters of its own (one child holds every parameter), its step is the child's step, so the child's profile
    # applies; descend until a module is identified or the parameters split over several children.
    total = sum(p.numel() for p in module.parameters())
    inner: torch.nn.Module | None = module
    while inner is not None:
        name = _identify_exact(inner, total)
        if name is not None:
            return name
        holders = [c for c in inner.children() if next(c.parameters(), None) is not None]
        inner = holders[0] if len(holders) == 1 and sum(p.numel() for p in holders[0].parameters()) == total else None
    return None


# Note [Scripted modules]: `torch.jit.script(model)` (NVIDIA DeepLearningExamples' ConvNets `--jit script`) returns a
# RecursiveScriptModule. Under emulation it died in its own __init__: gpemu's Module.__setattr__ patch (Note [Module
# structure cache] in replay.py) read `self._parameters`, which a script module does not have yet when it sets `_c`;
# the patch reads `_parameters` / `_modules` from __dict__ now. Once built, the scripted model was not identified
# (its class is RecursiveScriptModule for every architecture), so its steps ran on per-op predictions: ResNet-50 at
# batch 64, amp, on an A100 read 32.07 ms of GPU per step scripted and 44.46 ms eager (phase-predicted). A script
# module keeps the scripted class's name in `original_name`; identification uses it, and the parameter count
# decides as for any model (a scripted module's submodules are script modules too, so the head cannot be told apart:
# only the exact count matches).
def _class_name(module: torch.nn.Module) -> str:
    """Return the class name that identifies `module`: a script module's `original_name`, else its type's name."""
    if isinstance(module, torch.jit.ScriptModule):
        return str(getattr(module, "original_name", type(module).__name__))
    return type(module).__name__


def _identify_exact(module: torch.nn.Module, nparams: int) -> str | None:
    # Note [Replaced heads]: fine-tuning scripts replace the classifier (`model.fc = nn.Linear(2048, 101)`). The
    # backbone -- every parameter but the last nn.Linear's -- still identifies the architecture, and the head is a
    # sliver of the step (resnet50's 2048x1000 fc is ~0.4 % of its training FLOPs), so the zoo model's profile
    # stands for it: calibration scales the per-op costs, the smaller head included, to the profiled phase time.
    cls = _class_name(module).lower()
    prefixes = _TV_PREFIX.get(cls, (cls[:4],))
    counts = _torchvision_param_counts(prefixes)
    for name, (count, _) in counts.items():
        if count == nparams:
            return name
    backbone = nparams - _head_params(module)
    for name, (_, zoo_backbone) in counts.items():
        if zoo_backbone == backbone:
            return name
    return None


# ---- the tracker ---------------------------------------------------------------------------------------------


class PhaseTracker:
    """Follows forward/backward phases of the running script and scales op costs to profiled phase times."""

    def __init__(self, gpu_key: str, model: str | None = None, lookup: PhaseLookup | None = None) -> None:
        self.gpu_key = gpu_key
        self.model = model
        self.lookup = lookup or default_lookup
        self.predict_phases = lookup is None or lookup is default_lookup  # Note [Phase predictions]
        self.basis: dict[tuple[str, int, str, str, str], str] = {}  # target -> "measured" or the prediction path
        self.phase = "setup"
        self.top: torch.nn.Module | None = None
        self.frozen = False  # the top module has parameters that do not require grad (Note [Frozen parameters])
        # Note [Several forwards in a step]: whether the open step called a top module again before its backward
        # pass, and the step keys of such steps (their backward phases stay per op)
        self.split_step = False
        self.split_keys: set[tuple[str, int, str, str]] = set()
        self.key: tuple[str, int, str, str] | None = None  # (workload, batch size, dtype, memory format) of a step
        self.fp32_modes = (False, True)  # torch's TF32 flags at the last top-module call: Note [FP32 math modes]
        self.sums: dict[str, float] = {"forward": 0.0, "backward": 0.0, "eval": 0.0}
        self.eval_key: tuple[str, int, str, str] | None = None  # the open evaluation pass's step key
        self.prev: dict[tuple[str, int, str, str, str], float] = {}
        # Note [Accumulation steps]: per-op sums of backward phases that ran a backward pass and no optimizer step;
        # whether the open backward phase ran a backward pass, stepped, and is scaled from such a sum
        self.prev_plain: dict[tuple[str, int, str, str, str], float] = {}
        self.backward_ran = False
        self.stepped = False
        self.accumulating = False
        self.scale: float | None = None
        self.args: dict[str, object] = _PREDICTED_ARGS
        self.steps = 0
        self.module_calls = 0  # module calls outside a top module's forward (Note [Windows without a model call])
        self.workloads: dict[int, str | None] = {}
        self._targets: dict[tuple[str, int, str, str, str], float | None] = {}
        self._handles: list[Any] = []
        self._param_cache: dict[int, bool] = {}
        # Note [Keyword inputs]: global forward pre-hooks get only the positional arguments, but Hugging Face
        # models are called as `model(**batch)`. The patched Module.__call__ (replay.patch_module_call) leaves the
        # keyword arguments of a call made while no top module is open here; _pre takes them (and drops the
        # reference, so no batch is kept alive) when they belong to the module it sees.
        self.pending_kwargs: tuple[torch.nn.Module, dict[str, Any]] | None = None
        self.fusion = FusionGroups()  # See Note [Compiled regions] in fusion.py
        self.compiled: set[str] = set()  # workloads (or "<model>") stepped as compiled models, for reports
        self.fwd_seq_lo = -1  # the autograd sequence number at a compiled training forward's start
        self.compiled_step = False  # the open step's top module is compiled (Note [Compiled regions])
        self.region: torch.nn.Module | None = None  # a compiled submodule whose forward is open (regional)
        self.ranges: list[tuple[int, int]] = []  # the autograd sequence numbers of the regions' forwards
        self.regional_tops: set[int] = set()  # ids of top modules in which a compiled submodule ran
        self.fused_fraction: dict[tuple[str, int, str, str, str], float] = {}  # fused / unfused per-op sum
        self.replayed = False  # a replayed chunk was charged in the open phase (replay._charge_chunks sets it)
        # Note [Phases and CUDA graphs]: a phase target (measured or predicted) holds the host's dispatch between
        # kernels, which a graph replay does not have, and the scale is the target over the phase's per-op sum. So
        # ops charged while a capture is underway keep their per-op (kernel) predictions and stay out of the sums,
        # and a phase in which a graph was replayed is neither scaled from then on nor remembered as a basis (its
        # per-op sum misses the replayed kernels). Note [CUDA graphs] in gpemu/device/graph.py.
        self.capturing = 0  # CUDA graph captures underway (graphs.CUDAGraph)
        self.graph_replayed = False  # a CUDA graph was replayed in the open phase

    def graph_replay(self) -> None:
        """Note that a CUDA graph was replayed: the open phase runs on per-op predictions from here on."""
        self.graph_replayed = True
        self.scale = None
        self.args = _PREDICTED_ARGS

    def install(self) -> None:
        """Register the global module hooks."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.fusion.start(False)  # the optimizer step is not in the compiled graph (Note [Compiled regions])
        if self.phase != "backward":
            return
        self.stepped = True
        if self.accumulating:  # See Note [Accumulation steps]: the step and what follows it are priced per op
            self.phase = "step"
            self.scale = None
            self.args = _PREDICTED_ARGS

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.phase != "backward" or not self.backward_ran or torch._C._current_graph_task_id() != -1:
            return  # already per op (Note [Accumulation steps]), no backward pass yet, or a step inside one
        self._close_phase()  # See Note [Work after the step]
        self.phase = "after step"
        self.scale = None
        self.args = _PREDICTED_ARGS

    # Note [Imports inside the first forward]: model identification (identify_model) reads torchvision's model list,
    # and importing torchvision from the first top-module forward's pre-hook left a reference cycle through the
    # import's frames that reached up the call stack to Module._call_impl's frame, whose closure cell later held the
    # forward's output: `del y` after the first step did not free it until the garbage collector ran
    # (memory_allocated() 256 KiB high after a Linear(1024, 1024) step at batch 64, depending on what ran before).
    # The import happens at install.
    def warm(self) -> None:
        """Load the profile database and torchvision now, so the first forward does not pay for them inside the timed
        step (Note [Imports inside the first forward])."""
        if self.lookup is default_lookup:
            with contextlib.suppress(ImportError):
                import gpemu.profiles  # noqa: F401
        # a torchvision built for another torch raises RuntimeError ("operator torchvision::nms does not exist"),
        # not ImportError: a script that imports it fails on its own, one that does not still runs emulated
        with contextlib.suppress(Exception):
            import torchvision.models  # noqa: F401

    def uninstall(self) -> None:
        """Remove the global module hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def charge(self, predicted_s: float) -> tuple[float, dict[str, object]]:
        """Return (duration, trace args) for one op predicted at `predicted_s`, and add it to the phase sum."""
        if self.capturing:  # See Note [Phases and CUDA graphs]
            return predicted_s, _CAPTURED_ARGS
        phase = self.phase
        if phase == "forward" or phase == "backward":
            self.sums[phase] += predicted_s
            if phase == "backward" and not self.backward_ran and torch._C._current_graph_task_id() != -1:
                self.backward_ran = True  # See Note [Accumulation steps]
            if self.scale is not None:
                return predicted_s * self.scale, self.args
        elif phase == "eval":  # Note [Evaluation passes]
            self.sums["eval"] += predicted_s
            if self.scale is not None:
                return predicted_s * self.scale, self.args
        return predicted_s, _PREDICTED_ARGS

    # -- hooks

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        pending, self.pending_kwargs = self.pending_kwargs, None
        if self.top is not None:
            if self.region is None and not self.fusion.active and marked_compiled(module):
                self._enter_region(module)  # See Note [Compiled regions] in fusion.py: regional compilation
            return
        if _replica_thread() or torch._C._current_autograd_node() is not None:
            return  # inside backward: activation checkpointing's recomputation (Note [Modules called in backward])
        self.module_calls += 1
        from gpemu.torch_backend.tensor import EmuTensor, check_fp32_modes

        # cached op costs follow the TF32 flags, and so does the step's phase key (Note [FP32 math modes] in
        # cost/roofline.py)
        self.fp32_modes = check_fp32_modes()

        batch = next((a for a in args if isinstance(a, EmuTensor)), None)
        if batch is None and pending is not None and pending[0] is module:  # See Note [Keyword inputs]
            batch = next((v for v in pending[1].values() if isinstance(v, EmuTensor)), None)
        if batch is None or not self._has_params(module):  # loss modules are not the model
            return
        self._note_split_step()
        self._close_phase()
        self.top = module
        marked = compiled_module(module)  # See Note [Compiled regions] in fusion.py
        compiled = marked is not None
        self.compiled_step = compiled or id(module) in self.regional_tops
        self.fusion.start(compiled)
        self.region, self.ranges = None, []  # no block left open by a forward that raised
        if marked is not None:  # named by the compiled model, not by a DDP / DataParallel wrapper around it
            self.compiled.add(self._workload(module) or type(marked).__name__)
            if torch.is_grad_enabled():
                self.fwd_seq_lo = _next_sequence_nr()
        if not torch.is_grad_enabled():
            self.phase = "eval"
            self.key = None
            self.eval_key = self._step_key(module, batch)
            self.sums["eval"] = 0.0
            self._eval_scale(self.eval_key)
            return
        self.key = self._step_key(module, batch)
        if self.key is not None:  # See Note [Frozen parameters]
            from gpemu.torch_backend.replay import all_require_grad

            self.frozen = not all_require_grad(module)
        else:
            self.frozen = False
        self._begin("forward")
        self.steps += 1

    def _note_split_step(self) -> None:
        """Mark the step split when a training call opens before the last call's backward pass (Note [Several
        forwards in a step])."""
        if not torch.is_grad_enabled():
            return
        self.split_step = self.phase == "backward" and not self.backward_ran
        if self.split_step and self.key is not None:
            self.split_keys.add(self.key)

    def _step_key(self, module: torch.nn.Module, batch: Any) -> tuple[str, int, str, str] | None:
        """Return (workload, batch size, dtype, memory format) of a top-module call, or None (per-op pricing)."""
        workload = self._workload(module)
        compiled = compiled_module(module)
        if compiled is not None and compiled.__dict__.get("_gpemu_cudagraphs"):
            return None  # per op: Note [Compiled with CUDA graphs] in patches.py
        if isinstance(module, torch.nn.DataParallel) and len(module.device_ids or []) > 1:
            workload = None  # a profile is one GPU's step; the replicas' ops on N GPUs are not a slice of it
        if workload and not self.model and not _input_matches(workload, batch):  # 64x64 crops: not the profile's step
            workload = None
        if not workload:
            return None
        emu = state.current_emulation()
        amp = emu.autocast_dtype() if emu is not None else None
        dtype = "fp32" if amp is None else "amp_bf16" if amp == torch.bfloat16 else "amp"
        if amp is None and emu is not None and emu.devices[batch._index].spec.peak_tflops.get("tf32", 0.0):
            matmul_tf32, conv_tf32 = self.fp32_modes  # read by _pre for this call
            if not conv_tf32:
                return None  # no phase prediction prices IEEE fp32 convolutions: per op
            if matmul_tf32:
                dtype = "tf32"
        fmt = "channels_last" if _channels_last_step(module, batch) else "nchw"
        return (workload, int(batch.shape[0]) if batch.dim() else 1, dtype, fmt)

    def _eval_scale(self, key: tuple[str, int, str, str] | None) -> None:
        # Note [Evaluation passes]: profiles hold training phases only. An evaluation forward (no grad) of a model
        # whose training forward at the same (workload, batch, dtype, format) was already scaled to a profile or a
        # phase prediction takes that forward's scale: the ratio says what the per-op kernels leave out on this GPU
        # (host dispatch, the phase's fixed cost, the cost model's error for this model) and the evaluation runs
        # the same layers (batch norm on running statistics, no dropout: the per-op prices already say so). With
        # no such training forward first (another batch size, or evaluation only), the pass is scaled to the
        # inference phase prediction (Note [Inference forward] in workloads/optrace.py) by its first pass's per-op
        # sum, as a training phase is by its previous step's; that first pass, and compiled ones, stay per op.
        self.scale = None
        self.args = _PREDICTED_ARGS
        if key is None:
            return
        full = (*key, "forward")
        target, prev = self._targets.get(full), self.prev.get(full)
        if target is not None and self.compiled_step:  # See Note [Compiled regions] in fusion.py
            fraction = self.fused_fraction.get(full)
            target = None if fraction is None else target * fraction
        scaled_as = "training forward"
        if not (target is not None and prev) and not self.compiled_step:
            # no training forward of this key: the inference phase prediction, from the second pass on (the
            # first one's per-op sum is what it scales)
            full = (*key, "inference")
            target, prev, scaled_as = self._target(full), self.prev.get(full), "inference"
        if target is not None and prev:
            self.scale = target / prev
            basis = self.basis.get(full, "measured")
            self.args = {"timing": "calibrated" if basis == "measured" else "phase-predicted", "phase": "eval",
                         "scale": round(self.scale, 6), "profile_s": target, "workload": key[0], "basis": basis,
                         "scaled_as": scaled_as}

    def _enter_region(self, module: torch.nn.Module) -> None:
        """Open the forward of a compiled submodule of an uncompiled top module (regional compilation)."""
        self.region = module
        self.compiled.add(type(module).__name__)
        if self.top is not None:
            self.regional_tops.add(id(self.top))
        self.compiled_step = True
        self.fwd_seq_lo = _next_sequence_nr() if torch.is_grad_enabled() else -1
        self.fusion.start(True)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module is not self.top:
            if module is self.region:  # the end of a compiled block's forward: its backward nodes fuse too
                self.region = None
                self.fusion.start(False)
                if self.fwd_seq_lo >= 0:
                    self.ranges.append((self.fwd_seq_lo, _next_sequence_nr()))
            return
        self._close_phase()
        self.top = None
        if self.phase == "eval":
            self.fusion.start(False)
        elif self.fusion.active:  # the backward graph of the compiled forward is compiled too: a new region
            self.fusion.start_backward(((self.fwd_seq_lo, _next_sequence_nr()),))
        else:  # the blocks compiled inside an uncompiled model, if any
            self.fusion.start_backward(tuple(self.ranges))
        if self.key is not None:
            self._begin("backward")
        else:
            self.phase = "setup" if self.phase == "eval" else "backward"
            self.scale = None

    def _begin(self, phase: str) -> None:
        self.phase = phase
        self.sums[phase] = 0.0
        self.scale = None
        self.args = _PREDICTED_ARGS
        self.backward_ran = self.stepped = self.accumulating = False
        self.fusion.saved_s = 0.0
        self.replayed = False
        if self.key is None or (phase == "backward" and self.frozen):  # See Note [Frozen parameters]
            return
        if phase == "backward" and (self.split_step or self.key in self.split_keys):
            return  # See Note [Several forwards in a step]
        full = (*self.key, phase)
        target = self._target(full)
        if target is not None and self.compiled_step:  # See Note [Compiled regions]: eager target x fused fraction
            fraction = self.fused_fraction.get(full)
            target = None if fraction is None else target * fraction
        prev = self.prev.get(full)
        if phase == "backward" and full in self.prev_plain:  # See Note [Accumulation steps]
            prev, self.accumulating = self.prev_plain[full], True
        if target is not None and prev:
            self.scale = target / prev
            basis = self.basis.get(full, "measured")
            self.args = {"timing": "calibrated" if basis == "measured" else "phase-predicted", "phase": phase,
                         "scale": round(self.scale, 6), "profile_s": target, "workload": self.key[0], "basis": basis}

    def _close_phase(self) -> None:
        if self.phase == "eval" and self.eval_key is not None and self.sums["eval"] > 0:  # Note [Evaluation passes]
            self.prev[(*self.eval_key, "inference")] = self.sums["eval"]
            self.eval_key = None
        if self.graph_replayed:  # See Note [Phases and CUDA graphs]
            self.graph_replayed = False
            return
        if self.key is not None and self.phase in ("forward", "backward") and self.sums[self.phase] > 0:
            self.prev[(*self.key, self.phase)] = self.sums[self.phase]
            if self.phase == "backward" and self.backward_ran and not self.split_step:
                self.split_keys.discard(self.key)  # a one-forward step (Note [Several forwards in a step])
            if self.compiled_step and not self.replayed:  # See Note [Compiled regions] in fusion.py
                fused = self.sums[self.phase]
                self.fused_fraction[(*self.key, self.phase)] = fused / (fused + self.fusion.saved_s)
            if self.phase == "backward" and self.backward_ran and not self.stepped:  # Note [Accumulation steps]
                self.prev_plain[(*self.key, self.phase)] = self.sums[self.phase]

    def _has_params(self, module: torch.nn.Module) -> bool:
        key = id(module)
        has = self._param_cache.get(key)
        if has is None:
            has = self._param_cache[key] = next(module.parameters(), None) is not None
        return has

    def _workload(self, module: torch.nn.Module) -> str | None:
        if self.model:
            return self.model
        key = id(module)
        if key not in self.workloads:
            self.workloads[key] = identify_model(module)
        return self.workloads[key]

    def _target(self, full: tuple[str, int, str, str, str]) -> float | None:
        if full not in self._targets:
            workload, batch, dtype, fmt, phase = full
            # profiles are NCHW steps: a channels_last step is priced by the cost model (Note [Layout cost])
            target = self.lookup(self.gpu_key, workload, phase, batch, dtype) if fmt == "nchw" else None
            self.basis[full] = "measured"
            if target is None and self.predict_phases:
                got = predicted_phase(self.gpu_key, workload, phase, batch, dtype, fmt)
                if got is not None:
                    target, self.basis[full] = got
            self._targets[full] = target
        return self._targets[full]

    def describe(self) -> dict[str, object]:
        """Return what the tracker identified (for reports)."""
        return {
            "workloads": sorted({w for w in self.workloads.values() if w} | ({self.model} if self.model else set())),
            "steps": self.steps,
            "calibrated": {_label(k): v for k, v in self._targets.items()
                           if v is not None and self.basis.get(k) == "measured"},
            "phase_predicted": {_label(k): [v, self.basis.get(k)] for k, v in self._targets.items()
                                if v is not None and self.basis.get(k) != "measured"},
            "compiled": sorted(self.compiled),  # See Note [Compiled regions] in fusion.py
        }


def _label(key: tuple[str, int, str, str, str]) -> str:
    """Return "workload/batch/dtype[/channels_last]/phase" for a phase target (NCHW, the default, unnamed)."""
    return "/".join(str(part) for part in key if part != "nchw")


def _next_sequence_nr() -> int:
    """Return the autograd sequence number the next node made on this thread gets (replay's probe)."""
    from gpemu.torch_backend.replay import _next_sequence_nr as probe

    return probe()


def model_from_env() -> str | None:
    """Return GPEMU_MODEL if set."""
    return os.environ.get("GPEMU_MODEL") or None


_ = state  # the tracker is reached through state.current_emulation().phases
