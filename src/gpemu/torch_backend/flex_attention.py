"""FlexAttention on emulated tensors, priced as the fused attention kernel it compiles to (Note [FlexAttention])."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from gpemu.torch_backend.import_hooks import patch_when_imported
from gpemu.torch_backend.tensor import EmuTensor

if TYPE_CHECKING:
    from gpemu.torch_backend.patches import Patcher

_MODULE = "torch.nn.attention.flex_attention"
_MASK_PROBES = 64  # query and key positions the mask_mod is evaluated at (an evenly spaced grid)

# Note [FlexAttention]: `torch.nn.attention.flex_attention.flex_attention` runs a higher-order op whose autograd
# rule traces the score_mod with fake tensors (make_fx) and whose kernel torch.compile generates with Triton. On
# emulated tensors the trace refused them ("all unwrapped values must be FakeTensor, int, or SymInt, got
# [EmuTensor]") and eager mode has no rule for the op on a tensor subclass: pytorch/torchtitan's llama3 (FlexAttention
# by default) stopped at its first training step (session 15). On a GPU, flex_attention compiles to one fused
# attention kernel forward and one backward, in the mould of FlashAttention, skipping the key blocks its BlockMask
# rules out. For emulated q, k, v gpemu calls SDPA's fused kernel instead: `aten._scaled_dot_product_flash_attention`
# for 16-bit inputs with one head dim <= 256 (a multiple of 8) on compute capability >= 8.0 (the FlexAttention paper
# puts its Triton kernels at ~85-90 % of FlashAttention-2 there), `_scaled_dot_product_efficient_attention` otherwise:
# the same shapes, one fused kernel each way priced by the attention cost rule (4 B H Sq Sk D FLOPs forward, 2.5x
# backward), autograd through torch's own formula, no materialised score matrix. The block mask sets the work: its mask_mod is
# evaluated on the host over a grid of 64 x 64 query and key positions; the causal pattern (`q_idx >= kv_idx`) is
# priced as causal attention (half the blocks), any other pattern that evaluates (a no-op mask, a sliding window) or
# one that cannot be evaluated on the host (a document mask capturing device tensors) as dense attention: an upper
# bound. score_mod's elementwise work is not priced; GQA (`enable_gqa=True`) repeats the key and value heads.
# `return_lse` / `return_aux` give the log-sum-exp (and max scores as empty float32) of the shapes flex returns.
# CPU tensors keep torch's own path.


def mask_is_causal(block_mask: Any, q_len: int, kv_len: int) -> bool:
    """Return True when `block_mask`'s mask_mod keeps exactly `q_idx >= kv_idx` on an evenly spaced grid of positions
    (Note [FlexAttention]); False for no mask, another pattern, or a mask_mod the host cannot evaluate."""
    mask_mod = getattr(block_mask, "mask_mod", None)
    if mask_mod is None or q_len != kv_len:
        return False
    steps = min(_MASK_PROBES, q_len)
    q_idx = torch.linspace(0, q_len - 1, steps).round().long()[:, None]
    kv_idx = torch.linspace(0, kv_len - 1, steps).round().long()[None, :]
    try:
        kept = mask_mod(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long), q_idx, kv_idx)
        kept = torch.as_tensor(kept).to(torch.bool).broadcast_to((steps, steps))
    except Exception:  # a mask_mod over device tensors (documents), or one that needs its real arguments
        return False
    if isinstance(kept, EmuTensor):
        return False
    return bool(torch.equal(kept, q_idx >= kv_idx))


def _flash_shaped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Return True for inputs a FlashAttention-style kernel takes: 16-bit, one head dim <= 256 and a multiple of 8,
    on compute capability >= 8.0 (where flex's Triton kernel reaches FlashAttention-2's speed)."""
    from gpemu.torch_backend import state

    emu = state.current_emulation()
    if emu is None or query.dtype not in (torch.float16, torch.bfloat16):
        return False
    head = int(query.shape[-1])
    index = query._index if isinstance(query, EmuTensor) else 0
    return (tuple(emu.devices[index].spec.compute_capability) >= (8, 0) and head <= 256 and head % 8 == 0
            and int(key.shape[-1]) == head and int(value.shape[-1]) == head)


def emulated_flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any = None,
                            block_mask: Any = None, scale: float | None = None, enable_gqa: bool = False,
                            return_lse: bool = False, kernel_options: Any = None, *, return_aux: Any = None) -> Any:
    """flex_attention for emulated tensors: one fused attention kernel each way (Note [FlexAttention])."""
    q_len, kv_len = int(query.shape[-2]), int(key.shape[-2])
    heads, kv_heads = int(query.shape[-3]), int(key.shape[-3])
    if heads != kv_heads:
        if not enable_gqa:
            raise ValueError(f"Expect query and key/value to have the same number of heads but got Hq={heads} and "
                             f"Hkv={kv_heads}. Try setting enable_gqa=True for GQA.")
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
        value = value.repeat_interleave(heads // kv_heads, dim=-3)
    causal = mask_is_causal(block_mask, q_len, kv_len)
    if _flash_shaped(query, key, value):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, causal,
                                                                       scale=scale)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, True, 0.0, causal,
                                                                           scale=scale)[:2]
        lse = lse[..., :q_len]  # the kernel pads its log-sum-exp rows to a multiple of 32
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        max_scores = query.new_empty(lse.shape, dtype=torch.float32) if return_aux.max_scores else None
        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=max_scores)
    return (out, lse) if return_lse else out


def _patched(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def flex_attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, EmuTensor):
            return emulated_flex_attention(query, key, value, *args, **kwargs)
        return orig(query, key, value, *args, **kwargs)

    return flex_attention


def _patch(module: ModuleType, patcher: Patcher) -> None:
    patcher.set(module, "flex_attention", _patched(module.flex_attention))


def apply(patcher: Patcher) -> None:
    """Route flex_attention of emulated tensors to the fused-kernel emulation now, or when its module is imported."""
    patch_when_imported(_MODULE, _patch, patcher)
