"""MPT causal LMs as llm-foundry's `mpt_causal_lm` builds them by default, in plain torch, for gpemu's op tracer.

Config defaults (llm-foundry llmfoundry/models/mpt/configuration_mpt.py): learned position embeddings of max_seq_len,
Linear layers with bias (no_bias false), LayerNorm with bias, expansion ratio 4 with exact GELU, no dropout, the
output head tied to the token embedding, vocab 50368. Sizes from scripts/train/yamls/pretrain/mpt-<size>.yaml
(d_model, n_layers, n_heads). The parameter counts match the tables' NumParams column (1b at 2048 tokens:
1,315,950,592; tests: none, this is a bench). Attention is F.scaled_dot_product_attention (causal), which gpemu prices
as a fused flash kernel. Factories are module attributes `mpt_<size>_s<seq_len>` (seq_len sizes the position table).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16),
         "3b": (2560, 32, 20), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 56)}
VOCAB = 50368


class MPTBlock(nn.Module):
    """Pre-LN block: x + attn(norm_1(x)), then + ffn(norm_2(x))."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm_1, self.norm_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.Wqkv, self.out_proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.up_proj, self.down_proj = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the block's output (same shape as x)."""
        b, s, d = x.shape
        qkv = self.Wqkv(self.norm_1(x)).view(b, s, 3, self.n_heads, d // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out_proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x))))


class MPT(nn.Module):
    """Token + learned position embeddings, n_layers MPTBlocks, final LayerNorm, tied head."""

    def __init__(self, size: str, max_seq_len: int) -> None:
        super().__init__()
        d_model, n_layers, n_heads = SIZES[size]
        self.wte, self.wpe = nn.Embedding(VOCAB, d_model), nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(MPTBlock(d_model, n_heads) for _ in range(n_layers))
        self.norm_f = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits (batch, seq, vocab)."""
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm_f(x), self.wte.weight)


def __getattr__(name: str) -> Callable[[], nn.Module]:
    """Return the factory `mpt_<size>_s<seq_len>` (a language model for gpemu: gpemu_kind = "lm")."""
    parts = name.split("_")
    if len(parts) != 3 or parts[0] != "mpt" or parts[1] not in SIZES or not parts[2][1:].isdigit():
        raise AttributeError(name)
    size, max_seq_len = parts[1], int(parts[2][1:])

    def factory() -> nn.Module:
        return MPT(size, max_seq_len)

    factory.gpemu_kind = "lm"  # type: ignore[attr-defined]
    return factory
