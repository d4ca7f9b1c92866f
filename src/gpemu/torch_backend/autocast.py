"""Autocast emulation: under torch.autocast("cuda"), matmul/conv ops run (and are priced) in the autocast dtype.

See Note [Autocast on meta]: the C++ AutocastCUDA key only fires for tensors with a CUDA backend key; emulated tensors
are meta underneath, so gpemu casts the inputs of autocast's low-precision op list itself. Backward then sees
low-precision gradients next to fp32 saved inputs (autograd saved the originals, not the casts); for the same op list
mixed float dtypes are unified to the lowest precision, as autocast's saved casts would be on a real GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.hardware import GPUSpec
from gpemu.torch_backend import state

aten = torch.ops.aten

# aten overload packets autocast runs in fp16/bf16 on CUDA (torch/csrc/autograd autocast_mode.cpp "lower_precision_fp"
# list, reduced to the aten ops that reach the Python dispatch key).
_LOWP = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.addbmm,
    aten.convolution,
    aten.convolution_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten.prelu,
    aten.addmv,
    aten.mv,
    # autocast casts lstm_cell / gru_cell's inputs; on CUDA they run as the fused cell kernels (Note [Fused RNN cells])
    aten._thnn_fused_lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl,
    aten._thnn_fused_gru_cell,
    aten._thnn_fused_gru_cell_backward,
}
_LOWP_DTYPES = (torch.float16, torch.bfloat16)

# Note [Autocast's fp32 ops]
# Autocast's other list runs ops in fp32 whatever their inputs (autocast_mode.cpp "fp32": layer_norm, group_norm,
# softmax, log_softmax and more): a 16-bit activation is cast up and the op returns fp32. gpemu cast only the
# low-precision list, so under emulated AMP a layer norm of an fp16 activation stayed fp16: its output dtype differed
# from a GPU's (`y.dtype` float16 where CUDA says float32), the activations after it were half their real size, and
# the kernel was priced on 16-bit bytes, 0.6x of the time an H200 took (bench/op_validation.py, AMP layer norms of
# ViT-B/16, Swin-T and ConvNeXt-T). The four aten ops those functions reach are now cast up under autocast; a softmax
# asked for `half_to_float` already returns fp32 and is left alone. The loss and elementwise ops of that list are not
# emulated. The fp32 copy is not held as Note [Autocast casts take memory] holds the 16-bit ones: softmax and
# log_softmax save their output, not the cast input, and a layer norm's fp32 output, which a GPU's autograd releases
# once the next Linear has saved its 16-bit cast, stays saved here (the casts happen below autograd), standing in for
# the held input. Against the H200's measured AMP peaks (bench/heldout_memory_validation.py, batch 16-64): the LMs'
# fp32 logits moved bert-base from -19 to -5.5 % and gpt2 from -27 to -10.9 %; ConvNeXt-T +3 -> +9.7 %, Swin-T -11 ->
# +10.2 %, ViT-B/16 +6.7 % either way. Holding the copy too read +7.8 / +5.5 / +20.4 / +21.5 %.
_FP32 = {aten.native_layer_norm, aten.native_group_norm, aten._softmax, aten._log_softmax}


def adjust_for_autocast(
    func: Any, uargs: Any, ukwargs: Any, spec: GPUSpec, autocast_dtype: Any = None
) -> tuple[Any, Any, float]:
    """Return (args, kwargs, cast_seconds) with floating inputs cast to the autocast dtype for low-precision ops, and
    16-bit inputs cast to fp32 for autocast's fp32 ops (Note [Autocast's fp32 ops])."""
    packet = func.overloadpacket
    if packet in _FP32:
        if autocast_dtype is None or _half_to_float(packet, uargs, ukwargs):
            return uargs, ukwargs, 0.0
        target = torch.float32
    elif packet not in _LOWP:
        return uargs, ukwargs, 0.0
    elif autocast_dtype is not None:
        target = autocast_dtype
    else:
        dtypes = {t.dtype for t in _float_tensors(uargs)}
        low = [d for d in _LOWP_DTYPES if d in dtypes]
        if not low or len(dtypes) < 2:
            return uargs, ukwargs, 0.0
        target = low[0]
    cast_bytes = 0

    def cast(x: Any) -> Any:
        nonlocal cast_bytes
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != target and (
                target != torch.float32 or x.dtype in _LOWP_DTYPES):
            cast_bytes += x.numel() * (x.element_size() + torch.finfo(target).bits // 8)
            return x.to(target)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v) for v in x)
        return x

    new_args = tuple(cast(a) for a in uargs)
    new_kwargs = {k: cast(v) for k, v in ukwargs.items()}
    return new_args, new_kwargs, cast_bytes / spec.memory_bw_bytes_per_s


def _half_to_float(packet: Any, uargs: Any, ukwargs: Any) -> bool:
    """Return True for a softmax / log_softmax asked to return fp32 from a 16-bit input itself."""
    if packet not in (aten._softmax, aten._log_softmax):
        return False
    flag = uargs[2] if len(uargs) > 2 else ukwargs.get("half_to_float", False)
    return bool(flag)


def _float_tensors(tree: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for x in tree:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _float_tensors(x)
    return out


# Note [Autocast casts take memory]
# On a real GPU autocast casts each fp32 input of a low-precision op (above autograd): a parameter's copy is cached for
# the autocast region (one copy however often it is used) and, like every cast input, saved by the op for backward,
# so the copies live until backward has run. Our casts happen on meta, below autograd, and took no memory: an AMP
# step was predicted a parameter-set's worth of 16-bit copies too small (GPT-2 124M: ~240 MiB; a 7B model: ~13 GiB).
# gpemu therefore allocates, per low-precision op inside an enabled autocast("cuda") region, one block for each
# floating input not already in the autocast dtype: parameters (leaf tensors requiring grad) once per region, other
# inputs per use when grad mode is on (without grad they are transient: not held). The blocks are freed after the
# next backward pass, at the exit of an outermost autocast region with grad off (inference), and at the entry of the
# next outermost region if no backward came in between (its graph is gone).


def hold_casts(func: Any, args: Any, kwargs: Any, index: int) -> None:
    """Allocate the autocast input copies of one low-precision op (see Note [Autocast casts take memory])."""
    emu = state.current_emulation()
    if emu is None or func.overloadpacket not in _LOWP:  # fp32 ops hold nothing: Note [Autocast's fp32 ops]
        return
    target = emu.autocast_dtype()
    if target is None:
        return
    held = emu.autocast_casts
    grad = torch.is_grad_enabled()
    size = torch.empty((), dtype=target).element_size()
    device = emu.devices[index]
    for x in _float_tensors((*args, *kwargs.values())):
        if x.dtype == target or x.device.type != "cuda":
            continue
        root = x._base if x._base is not None else x  # F.linear reaches mm with the weight's transposed view
        if root.requires_grad and root.grad_fn is None:  # a parameter: cached once per autocast region
            key: Any = ("param", id(root), target)
            if key in held:
                continue
        elif grad:
            key = object()
        else:
            continue
        held[key] = (index, device.allocator.malloc(x.numel() * size, emu.current_stream(index).pool_id,
                                                    "autocast cast"))


def release_casts() -> None:
    """Free every held autocast copy (after backward, or when its autocast region and graph are gone)."""
    emu = state.current_emulation()
    if emu is None or not emu.autocast_casts:
        return
    for index, handle in emu.autocast_casts.values():
        emu.devices[index].allocator.free(handle)
    emu.autocast_casts.clear()


# Note [Conv bias under autocast]: torch.conv1d/2d/3d (composite ops, so before any dispatch gpemu sees) check that the
# bias has the input's dtype. On a GPU the AutocastCUDA key casts input, weight and bias to the autocast dtype first;
# on meta tensors it does not fire, so a convolution with a bias whose input is already 16-bit (the output of an
# earlier autocast layer: every conv of a ConvNeXt but the stem) failed with "Input type (c10::Half) and bias type
# (float) should be the same". Inside an enabled autocast("cuda") region the patched functions cast a floating bias
# of another dtype to the input's 16-bit dtype (as autocast would; weight casts stay with adjust_for_autocast).
def _patched_conv(orig: Any) -> Any:
    import functools

    from gpemu.torch_backend.tensor import EmuTensor

    @functools.wraps(orig)
    def conv(input: Any, weight: Any, bias: Any = None, *args: Any, **kwargs: Any) -> Any:
        if (bias is not None and isinstance(input, EmuTensor) and input.dtype in _LOWP_DTYPES
                and bias.dtype != input.dtype and bias.is_floating_point()):
            emu = state.current_emulation()
            if emu is not None and emu.autocast_dtype() is not None:
                bias = bias.to(input.dtype)
        return orig(input, weight, bias, *args, **kwargs)

    return conv


# Note [Linear bias under autocast]: F.linear is composite too. A contiguous input reaches `addmm` (on autocast's list:
# adjust_for_autocast casts all three operands), but a non-contiguous 3-D one (a transposed conv output, as
# Autoformer's TokenEmbedding returns) decomposes to `mm` + `add(out, bias)`: the mm ran in fp16 and the add promoted
# it back to fp32 with the fp32 bias, so every later layer ran (and was priced) in fp32, and an fp16 `torch.fft.rfft`
# that raises on a GPU ran. On a GPU the AutocastCUDA key casts input, weight and bias of `linear` to the autocast
# dtype before it decomposes, so the output is 16-bit either way. Inside an enabled autocast("cuda") region the
# patched F.linear casts a floating bias of another dtype to the autocast dtype first.
def _patched_linear(orig: Any) -> Any:
    import functools

    from gpemu.torch_backend.tensor import EmuTensor

    @functools.wraps(orig)
    def linear(input: Any, weight: Any, bias: Any = None) -> Any:
        if bias is not None and isinstance(input, EmuTensor) and bias.is_floating_point():
            emu = state.current_emulation()
            low = emu.autocast_dtype() if emu is not None else None
            if low is not None and bias.dtype != low:
                bias = bias.to(low)
        return orig(input, weight, bias)

    return linear


def apply(patcher: Any) -> None:
    """Patch torch.conv1d/2d/3d, their torch.nn.functional names and F.linear (See Note [Conv bias under autocast],
    Note [Linear bias under autocast])."""
    import torch.nn.functional as F

    for name in ("conv1d", "conv2d", "conv3d"):
        patched = _patched_conv(getattr(torch, name))
        patcher.set(torch, name, patched)
        patcher.set(F, name, patched)
    patcher.set(F, "linear", _patched_linear(F.linear))
