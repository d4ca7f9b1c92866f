"""Moving modules to the emulated GPU keeps parameter identity, as `Module.cuda()` does on a real GPU.

Note [Module moves keep identity]: on a real GPU, `Module._apply` (behind `.cuda()`, `.to()`, `.half()`) changes each
parameter in place (`param.data = param.cuda()`), so the Parameter objects survive the move: weights tied between two
modules (GPT-2's token embedding and output layer) stay one tensor, and an optimizer built *before* `model.cuda()`
still holds the model's parameters. Our emulated tensors are a different TensorImpl type than CPU tensors, torch
refuses that in-place change, and `_apply` creates new Parameter objects instead: a tie came apart (two tensors,
memory counted twice, separate gradients) and such an optimizer kept stepping the old CPU parameters. So after the
outermost `_apply` of a move onto the emulated device, every parameter and buffer that moved is swapped back into its
original Python object (`torch.utils.swap_tensors`; gpemu's own weak references are moved across) and every module
slot that shared the original object gets it again. If a swap is impossible (some other weak reference to the
tensor), the slots still share one new tensor and a one-time warning says that references taken before the move see
the CPU tensor. A dtype change of a module already on the device (`.half()`, `.float()`) replaces its buffers with
new tensors, as torch does on a GPU (parameters keep identity through `param.data`): no warning (before session 10
ultralytics' validator, which runs `model.float()` on its on-device EMA model, warned on every run).

Recurrent layers inside a moved module: `RNNBase._apply` rebuilds `_flat_weight_refs` (weak references to its new
parameters) once its own move is done, before the outermost `_apply` restores identity, so the swap saw someone
watching every nn.GRU/nn.LSTM weight and gave up: `EncoderRNN(...).to(device)` (an embedding and a GRU, pytorch/
tutorials seq2seq_translation_tutorial) warned and lost its GRU's identity. Those references are dropped before the
swap and rebuilt after it from the module's attributes (without a second flatten_parameters).

Note [Weight-norm caches]: `torch.nn.utils.weight_norm` keeps `module.weight` as a plain attribute computed from the
`weight_g` / `weight_v` parameters (at wrap time, then by its pre-hook before every forward), and `spectral_norm`
likewise from `weight_orig` after a forward; that tensor's autograd node holds the parameters, so `swap_tensors` saw
a third reference and refused: DINO's `DINOHead.last_layer` (built on the CPU, then `.cuda()`) warned on every run
and its `weight_g` / `weight_v` became new objects. On a GPU the attribute stays the stale CPU tensor until the next
forward recomputes it; before the swap gpemu replaces it with its `detach()` (the same values, no graph), which
frees the parameters for the swap.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from gpemu.errors import GpemuWarning
from gpemu.torch_backend import ops, state
from gpemu.torch_backend import tensor as emu_tensor
from gpemu.torch_backend.tensor import EmuTensor

_tls = threading.local()
_warned = False
Slot = tuple[dict[str, Any], str]  # (module._parameters or module._buffers, name)


def _slots(root: torch.nn.Module) -> dict[int, tuple[Any, list[Slot]]]:
    """Return id(tensor) -> (tensor, every parameter/buffer slot holding it) over the module tree."""
    out: dict[int, tuple[Any, list[Slot]]] = {}
    for module in root.modules():
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is not None:
                    out.setdefault(id(value), (value, []))[1].append((table, name))
    return out


def _adopt(old: torch.Tensor, new: EmuTensor) -> bool:
    """Make the Python object `old` be the emulated tensor `new` (swap their contents); return False if impossible."""
    if weakref.getweakrefs(old):
        return False
    refs = [r for r in weakref.getweakrefs(new) if isinstance(r, emu_tensor._StorageRef)]
    keys = [r.key for r in refs]
    emu_tensor._refs.difference_update(refs)  # the references die without their callbacks: storage stays accounted
    del refs
    value = ops.known_value(new)  # a buffer's host value (BatchNorm's num_batches_tracked) moves with it
    ops._known.pop(id(new), None)
    if weakref.getweakrefs(new):  # someone else watches `new`: put ours back and give up
        _track(new, keys)
        return False
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError:
        _track(new, keys)
        return False
    _track(old, keys)
    if value is not None:
        ops.set_known_value(old, value)  # type: ignore[arg-type]  # `old` is the emulated tensor now
    return True


def _track(t: torch.Tensor, keys: list[int]) -> None:
    for key in keys:
        ref = emu_tensor._StorageRef(t, emu_tensor._on_dead)
        ref.key = key
        emu_tensor._refs.add(ref)


def _restore_identity(before: dict[int, tuple[Any, list[Slot]]]) -> None:
    global _warned
    for old, slots in before.values():
        table, name = slots[0]
        new = table.get(name)
        if new is None or new is old:
            continue
        onto_device = isinstance(new, EmuTensor) and not isinstance(old, EmuTensor)
        keep = old if onto_device and _adopt(old, new) else new
        # only a move onto the device loses an identity a GPU keeps: an on-device dtype change replaces buffers on
        # a GPU too (ultralytics' validator runs `model.float()` on its EMA model and warned on every run)
        if keep is new and onto_device and not _warned:
            _warned = True
            warnings.warn("gpemu: a parameter could not keep its identity when moved to the emulated GPU; objects "
                          "taken before the move (e.g. an optimizer built before model.cuda()) still see the CPU "
                          "tensor", GpemuWarning, stacklevel=4)
        for t, n in slots:
            t[n] = keep


def _detach_norm_caches(root: torch.nn.Module) -> None:
    """Detach the weights that weight_norm / spectral_norm hooks computed before a move (Note [Weight-norm caches])."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for module in root.modules():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, (WeightNorm, SpectralNorm)):
                cached = module.__dict__.get(hook.name)
                if isinstance(cached, torch.Tensor) and cached.grad_fn is not None:
                    module.__dict__[hook.name] = cached.detach()


# Note [Moves off the device in inference mode]: `Module._apply` moves a parameter in place (`param.data = new`)
# when torch says the two tensors' implementations are compatible, else it makes a new Parameter. An emulated
# parameter made under `torch.inference_mode()` (QAT's `copy.deepcopy(model)` inside `with torch.inference_mode():`
# before `.to("cpu")` and `torch.ao.quantization.convert`, torchvision references/classification/
# train_quantization.py) carries no autograd keys, and torch calls it compatible with a CPU tensor: `.data = cpu`
# replaced its inner tensor while the wrapper still said cuda:0, so every parameter stayed "on the GPU" and convert
# died in `fuse_conv_bn_weights` ("Expected all tensors to be on the same device, ... cuda:0 and cpu"). On a GPU the
# parameter becomes a CPU tensor. While gpemu moves a module, a parameter (or gradient) leaving the emulated device
# takes torch's other path, a new Parameter on the host, as every emulated parameter made outside inference mode
# already does (torch finds those incompatible): `fn` raises torch's overwrite-on-conversion flag for that one call.
def _leaving_device(fn: Any, overwrite: bool) -> Any:
    """Wrap `_apply`'s `fn` so an emulated tensor moved to the host is replaced, not set in place (Note [Moves off
    the device in inference mode])."""

    def moved(t: Any) -> Any:
        out = fn(t)
        _set_overwrite(overwrite or (isinstance(t, EmuTensor) and not isinstance(out, EmuTensor)))
        return out

    return moved


_set_overwrite = torch.__future__.set_overwrite_module_params_on_conversion


def patched_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """Return a `Module._apply` that keeps parameter identity across moves to the emulated GPU."""

    def _apply(self: torch.nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "depth", 0) or state.current_emulation() is None:
            return original(self, fn, *args, **kwargs)
        before = _slots(self)
        _tls.depth = 1
        overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        try:
            out = original(self, _leaving_device(fn, overwrite), *args, **kwargs)
        finally:
            _tls.depth = 0
            _set_overwrite(overwrite)
        _detach_norm_caches(self)
        rnns = [m for m in self.modules() if isinstance(m, torch.nn.RNNBase)]
        for m in rnns:  # its weak references to the new weights would stop the swap (see the module docstring)
            m._flat_weight_refs = []
        _restore_identity(before)
        for m in rnns:  # RNNBase._init_flat_weights without its flatten_parameters() (already done, and charged)
            m._flat_weights = [getattr(m, n) if hasattr(m, n) else None for n in m._flat_weights_names]
            m._flat_weight_refs = [weakref.ref(w) if w is not None else None for w in m._flat_weights]
        return out

    _apply.__wrapped__ = original  # type: ignore[attr-defined]
    return _apply


def apply(patcher: Any) -> None:
    """Install the identity-keeping `Module._apply` through `patcher`."""
    patcher.set(torch.nn.Module, "_apply", patched_apply(torch.nn.Module._apply))
