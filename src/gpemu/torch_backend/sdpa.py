"""`F.scaled_dot_product_attention` on the emulated GPU picks the fused kernel a real GPU would (flash, efficient).

Note [SDPA backend choice]: torch chooses the SDPA kernel in C++ from the tensors' device. Our wrapper tensors are
`meta` underneath, so torch took the math path: ~21 ops forward and ~26 backward (bmm, softmax, dropout), a
materialised B x H x Sq x Sk score matrix in memory, and ~1 ms of host time per call. A real GPU runs one fused
kernel each way and never stores the scores. For emulated inputs gpemu applies torch's CUDA rules in Python, in
torch's order, honouring `torch.backends.cuda.{flash,mem_efficient,math}_sdp_enabled()` (and so `sdpa_kernel`):
- flash: compute capability >= 8.0, fp16/bf16, 4-D inputs, head dim <= 256 and a multiple of 8, no attn_mask;
- memory-efficient: compute capability >= 5.0, fp16/bf16/fp32, 4-D inputs, head dim a multiple of 8 (16-bit) or 4
  (fp32); an attn_mask becomes its additive bias (boolean masks as 0 / -inf, as torch does);
- otherwise torch's own path (math).
It then calls `aten._scaled_dot_product_{flash,efficient}_attention`, whose autograd formulas, meta kernels and
gpemu cost functions (registry: 4*B*H*Sq*Sk*D forward, 2.5x backward) do the rest. GQA (`enable_gqa=True`) and
nested tensors keep torch's path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from gpemu.torch_backend import state
from gpemu.torch_backend.tensor import EmuTensor

aten = torch.ops.aten
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def choose_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, capability: tuple[int, int],
                   dtype: torch.dtype) -> str:
    """Return "flash", "efficient" or "math": the kernel a real GPU of `capability` would run (Note [SDPA ...])."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "math"
    head = int(q.shape[-1])
    same_head = int(k.shape[-1]) == head and int(v.shape[-1]) == head
    if (torch.backends.cuda.flash_sdp_enabled() and capability >= (8, 0) and dtype in _FLASH_DTYPES
            and attn_mask is None and same_head and head <= 256 and head % 8 == 0):
        return "flash"
    align = 4 if dtype == torch.float32 else 8
    if (torch.backends.cuda.mem_efficient_sdp_enabled() and capability >= (5, 0) and dtype in _EFFICIENT_DTYPES
            and head % align == 0 and int(v.shape[-1]) % align == 0):
        return "efficient"
    return "math"


def _as_bias(attn_mask: Any, q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> Any:
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:  # torch's convert_boolean_attn_mask: True keeps, False masks
        attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    shape = (int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2]))
    return attn_mask.to(dtype).expand(shape)


def fused_sdpa(original: Callable[..., Any], capability: tuple[int, int], dtype: torch.dtype, query: Any, key: Any,
               value: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
               scale: float | None = None, enable_gqa: bool = False) -> Any:
    """Return SDPA computed with the kernel a GPU of `capability` would run in `dtype` (math: `original`)."""
    backend = "math" if enable_gqa or query.is_nested else choose_backend(query, key, value, attn_mask, capability,
                                                                           dtype)
    if backend == "math":
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
    if query.dtype != dtype:  # autocast: the fused kernels run in the autocast dtype
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    bias = _as_bias(attn_mask, query, key, dtype)
    return aten._scaled_dot_product_efficient_attention(query, key, value, bias, needs_grad, dropout_p, is_causal,
                                                        scale=scale)[0]


# Note [SDPA under autocast]: scaled_dot_product_attention is on autocast's lower-precision list: on a GPU its
# floating inputs (and a float mask) are cast to the autocast dtype before any backend runs. The fused backends here
# cast q/k/v themselves, but the math backend (taken with enable_gqa=True, as transformers passes for grouped-query
# attention without a mask) handed mixed inputs to torch (Llama's RoPE leaves q and k in fp32 beside a bf16 v), and
# torch refused them ("Expected query, key, and value to have the same dtype"). All backends now see the casts.


def patched(original: Callable[..., Any]) -> Callable[..., Any]:
    """Return an `F.scaled_dot_product_attention` that routes emulated inputs to the fused kernels."""

    @functools.wraps(original)
    def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                     dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> Any:
        emu = state.current_emulation()
        if (emu is None or not isinstance(query, EmuTensor) or not isinstance(key, EmuTensor)
                or not isinstance(value, EmuTensor)):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        capability = tuple(emu.devices[query._index].spec.compute_capability)
        low = emu.autocast_dtype()
        if low is not None:  # See Note [SDPA under autocast]
            query, key, value = (t.to(low) if t.is_floating_point() and t.dtype != low else t
                                 for t in (query, key, value))
            if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() and attn_mask.dtype != low:
                attn_mask = attn_mask.to(low)
        return fused_sdpa(original, capability, low or query.dtype, query, key,  # type: ignore[arg-type]
                          value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    return scaled_dot_product_attention


def patched_for_meta(original: Callable[..., Any], capability: tuple[int, int]) -> Callable[..., Any]:
    """Return an `F.scaled_dot_product_attention` that routes plain meta tensors as a GPU of `capability` would
    (the memory predictor's simulation: gpemu.memory)."""

    @functools.wraps(original)
    def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                     dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> Any:
        if not (isinstance(query, torch.Tensor) and query.device.type == "meta"):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else query.dtype
        return fused_sdpa(original, capability, dtype, query, key, value, attn_mask, dropout_p, is_causal, scale,
                          enable_gqa)

    return scaled_dot_product_attention


def apply(patcher: Any) -> None:
    """Install the routing `F.scaled_dot_product_attention` through `patcher`."""
    import torch.nn.functional as F

    patcher.set(F, "scaled_dot_product_attention", patched(F.scaled_dot_product_attention))
