"""Note [FlexAttention]: flex_attention of emulated tensors runs as SDPA's fused kernel, causal when its mask is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import gpemu.torch_backend as gt
from gpemu.torch_backend.flex_attention import mask_is_causal

B, H, L, D = 4, 8, 1024, 64


@pytest.fixture
def h100() -> Iterator[gt.Emulation]:
    """Return an installed 1x H100 emulation; uninstall afterwards."""
    e = gt.install("h100")
    yield e
    gt.uninstall()


def _causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


def _window(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 128)


def _busy_s(emu: gt.Emulation, fn: object) -> float:
    dev = emu.devices[0]
    torch.cuda.synchronize()
    before = dev.busy_s()
    fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    return dev.busy_s() - before


def test_the_mask_mod_is_read_on_a_grid_of_positions() -> None:
    class Mask:
        def __init__(self, fn: object) -> None:
            self.mask_mod = fn

    assert mask_is_causal(Mask(_causal), 1024, 1024)
    assert not mask_is_causal(Mask(_window), 1024, 1024)  # a sliding window: priced dense (an upper bound)
    assert not mask_is_causal(Mask(lambda b, h, q, kv: q >= 0), 1024, 1024)  # no-op mask
    assert not mask_is_causal(Mask(_causal), 1024, 512)  # cross attention
    assert not mask_is_causal(None, 1024, 1024)


def test_flex_attention_costs_the_fused_kernel_causal_or_dense(h100: gt.Emulation) -> None:
    # bf16, head dim 64, compute capability 9.0: the flash kernel. With a causal BlockMask the forward and backward
    # cost what SDPA's is_causal=True flash kernels cost; with no mask, what the dense ones cost (twice the FLOPs:
    # 4 B H L^2 D = 4 x 4 x 8 x 1024^2 x 64 = 8.6 GFLOP forward dense, half of it causal)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = create_block_mask(_causal, None, None, L, L, device="cuda")
    flex_causal = _busy_s(h100, lambda: flex_attention(q, k, v, block_mask=mask))
    sdpa_causal = _busy_s(h100, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    flex_dense = _busy_s(h100, lambda: flex_attention(q, k, v))
    sdpa_dense = _busy_s(h100, lambda: F.scaled_dot_product_attention(q, k, v))
    assert flex_causal == pytest.approx(sdpa_causal, rel=1e-9)
    assert flex_dense == pytest.approx(sdpa_dense, rel=1e-9)
    assert flex_causal < flex_dense
    out = flex_attention(q, k, v, block_mask=mask)
    assert out.shape == (B, H, L, D) and out.dtype == torch.bfloat16 and out.is_cuda
    backward_s = _busy_s(h100, lambda: out.float().sum().backward())
    assert q.grad is not None and q.grad.shape == (B, H, L, D) and k.grad is not None and v.grad is not None
    assert backward_s > 2 * flex_causal  # the attention backward is priced at 2.5x its forward, plus the sum's


def test_gqa_lse_and_compiled_flex_attention(h100: gt.Emulation) -> None:
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(B, 2, L, D, device="cuda", dtype=torch.bfloat16)
    assert flex_attention(q, kv, kv, enable_gqa=True).shape == (B, H, L, D)
    with pytest.raises(ValueError, match="enable_gqa"):
        flex_attention(q, kv, kv)
    out, lse = flex_attention(q, q, q, return_lse=True)
    assert lse.shape == (B, H, L) and lse.dtype == torch.float32
    out, aux = flex_attention(q, q, q, return_aux=AuxRequest(lse=True, max_scores=True))
    assert aux.lse is not None and aux.lse.shape == (B, H, L) and aux.max_scores is not None
    compiled = torch.compile(flex_attention)  # runs eager under gpemu: the same routing
    assert compiled(q, q, q).shape == (B, H, L, D)
    fp32 = torch.randn(B, H, L, D, device="cuda")  # fp32: the memory-efficient kernel (its lse rows padded to 32)
    out, lse = flex_attention(fp32, fp32, fp32, return_lse=True)
    assert out.dtype == torch.float32 and lse.shape == (B, H, L)
