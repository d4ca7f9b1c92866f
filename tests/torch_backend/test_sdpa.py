"""SDPA on the emulated GPU runs the fused kernel a real GPU would choose, with its memory (no score matrix)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import gpemu.torch_backend as gt
from gpemu.torch_backend import tensor as emu_tensor
from gpemu.torch_backend.sdpa import choose_backend


@pytest.fixture
def a100() -> Any:
    e = gt.install("a100")
    yield e
    gt.uninstall()


def _ops(fn: Any) -> list[str]:
    names: list[str] = []
    original = emu_tensor.run_op

    def spy(func: Any, args: Any, kwargs: Any) -> Any:
        names.append(func.__name__)
        return original(func, args, kwargs)

    emu_tensor.run_op = spy
    try:
        fn()
    finally:
        emu_tensor.run_op = original
    return names


@pytest.mark.parametrize(
    ("capability", "dtype", "mask", "head", "backend"),
    [
        ((8, 0), torch.bfloat16, False, 64, "flash"),  # A100, 16-bit, no mask
        ((8, 0), torch.bfloat16, True, 64, "efficient"),  # flash takes no arbitrary mask
        ((8, 0), torch.float32, False, 64, "efficient"),  # flash is 16-bit only
        ((7, 0), torch.float16, False, 64, "efficient"),  # V100: no flash before sm80
        ((8, 0), torch.float16, False, 512, "efficient"),  # flash head dim <= 256
        ((8, 0), torch.float32, False, 30, "math"),  # 30 is not a multiple of 4
    ],
)
def test_backend_choice_follows_torchs_cuda_rules(capability: tuple[int, int], dtype: torch.dtype, mask: bool,
                                                   head: int, backend: str) -> None:
    q = torch.empty(2, 4, 16, head, device="meta", dtype=dtype)
    attn_mask = torch.empty(16, 16, device="meta", dtype=torch.bool) if mask else None
    assert choose_backend(q, q, q, attn_mask, capability, dtype) == backend


def test_flash_attention_is_one_kernel_each_way_without_the_score_matrix(a100: Any) -> None:
    q = torch.randn(8, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    base = torch.cuda.memory_allocated()
    out: list[torch.Tensor] = []
    fwd = _ops(lambda: out.append(F.scaled_dot_product_attention(q, q, q, is_causal=True)))
    assert [n for n in fwd if n != "detach.default"] == ["_scaled_dot_product_flash_attention.default"]
    # output 8*8*1024*64*2 B = 8 MiB, log-sum-exp 8*8*1024*4 B = 256 KiB; the math path would also hold the
    # 8*8*1024*1024*2 B = 128 MiB scores; plus the kernel's two tiny RNG-state tensors (philox seed and offset),
    # one 512-byte block each
    assert torch.cuda.memory_allocated() - base == 8 * 2**20 + 256 * 2**10 + 2 * 512
    bwd = _ops(lambda: out[0].sum().backward())
    assert "_scaled_dot_product_flash_attention_backward.default" in bwd and "bmm.default" not in bwd
    assert q.grad is not None and q.grad.shape == q.shape


def test_transformer_layer_fp32_uses_memory_efficient_attention(a100: Any) -> None:
    layer = torch.nn.TransformerEncoderLayer(512, 8, batch_first=True).cuda()
    x = torch.randn(4, 30, 512, device="cuda")
    mask = torch.zeros(4, 30, dtype=torch.bool, device="cuda")
    names = _ops(lambda: layer(x, src_key_padding_mask=mask))
    assert "_scaled_dot_product_efficient_attention.default" in names and "_safe_softmax.default" not in names


def test_sdpa_kernel_math_is_honoured(a100: Any) -> None:
    q = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.MATH):
        names = _ops(lambda: F.scaled_dot_product_attention(q, q, q))
    assert "_safe_softmax.default" in names and not any("flash" in n for n in names)


def test_autocast_casts_mixed_inputs_for_every_backend(a100: Any) -> None:
    # Llama under bf16 autocast: RoPE leaves q and k in fp32 beside a bf16 v, and grouped-query attention without a
    # mask goes to the math backend with enable_gqa=True; torch refused the mixed dtypes there (Note [SDPA under
    # autocast]) while a GPU's autocast casts all three first
    q = torch.randn(2, 8, 16, 32, device="cuda", requires_grad=True)
    k = torch.randn(2, 2, 16, 32, device="cuda", requires_grad=True)
    v = torch.randn(2, 2, 16, 32, device="cuda").bfloat16().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 8, 16, 32)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32  # gradients flow back through the casts
    assert v.grad is not None and v.grad.dtype == torch.bfloat16
    # without autocast a genuine mismatch still fails as it does on a GPU
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
