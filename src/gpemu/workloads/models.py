"""The model zoo: torchvision classifiers, BERT-base and GPT-2 built offline, and users' `module:factory` models."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpemu.errors import GpemuError, UnknownNameError

IMAGE_SIZE = 224  # pixels; GPEmu's profiles use 3x224x224 inputs
NUM_CLASSES = 1000
SEQ_LEN = 512  # tokens per sample for the language models


# -- transformer configs (published values; no download) ----------------------------------------------------------
# BERT-base-uncased: Devlin et al. 2019 / google-research/bert config (vocab 30522, hidden 768, 12 layers, 12 heads,
# intermediate 3072, 512 positions, 2 token types). GPT-2 small (124M): Radford et al. 2019 / openai gpt-2 hparams
# (vocab 50257, n_ctx 1024, n_embd 768, n_layer 12, n_head 12).
_LM_CONFIGS: dict[str, dict[str, int]] = {
    "bert-base": {"vocab": 30522, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "positions": 512},
    "gpt2": {"vocab": 50257, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "positions": 1024},
}


class _Block(nn.Module):
    """One transformer layer: post-LN (BERT) or pre-LN (GPT-2), attention through F.scaled_dot_product_attention."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool, pre_ln: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.causal, self.pre_ln = heads, causal, pre_ln
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.drop = nn.Dropout(dropout)
        self.dropout_p = dropout

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.dropout_p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the layer's output (same shape as x)."""
        if self.pre_ln:
            x = x + self._attn(self.ln1(x))
            return x + self._mlp(self.ln2(x))
        x = self.ln1(x + self._attn(x))
        return self.ln2(x + self._mlp(x))


class TransformerLM(nn.Module):
    """BERT-style masked LM (bidirectional, post-LN) or GPT-2-style causal LM (pre-LN, tied head)."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, positions: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(positions, hidden)
        self.tok_type = None if causal else nn.Embedding(2, hidden)
        self.emb_ln = None if causal else nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(_Block(hidden, heads, ffn, causal, causal, 0.1) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden) if causal else None
        # BERT's MLM head: dense + gelu + LN, then the decoder tied to the token embedding.
        self.head_dense = None if causal else nn.Linear(hidden, hidden)
        self.head_ln = None if causal else nn.LayerNorm(hidden)
        self.head_bias = nn.Parameter(torch.zeros(vocab))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, seq, vocab)."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        if self.tok_type is not None and self.emb_ln is not None:
            x = self.emb_ln(x + self.tok_type(torch.zeros_like(ids)))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if self.head_dense is not None and self.head_ln is not None:
            x = self.head_ln(F.gelu(self.head_dense(x)))
        return F.linear(x, self.tok.weight, self.head_bias)


# Note [Sequence length in the model name]: a language model's sequence length is part of its workload name,
# "gpt2@1024" (default SEQ_LEN when absent), so every layer keyed by the name -- trace cache, profile lookups, memory
# prediction, the drop-in's phase targets -- tells one length from another without a new argument everywhere.
# `gpemu predict --seq-len N` writes it; a length beyond the model's positions is an error naming the limit.
def split_seq_len(name: str) -> tuple[str, int | None]:
    """Return (base name, sequence length or None) of a workload name such as "gpt2@1024"."""
    base, sep, tail = name.rpartition("@")
    if sep and base and tail.isdigit():
        return base, int(tail)
    return name, None


def seq_len(name: str) -> int:
    """Return the tokens per sample of a language-model workload name (Note [Sequence length in the model name])."""
    base, length = split_seq_len(name)
    if length is None:
        return SEQ_LEN
    positions = _LM_CONFIGS.get(base, {}).get("positions")
    if length < 1 or (positions is not None and length > positions):
        raise GpemuError(f"sequence length {length} for {base!r}: use 1 to {positions} (its position embeddings)")
    return length


def _torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def list_models() -> list[str]:
    """Return every built-in model name: torchvision classifiers, then "bert-base" and "gpt2"."""
    return [*_torchvision_names(), *_LM_CONFIGS]


def _is_factory_ref(name: str) -> bool:
    return ":" in name and all(part.strip() for part in name.split(":", 1))


def _load_factory(ref: str) -> Callable[[], nn.Module]:
    module_name, attr = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GpemuError(f"cannot import {module_name!r} for model {ref!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise GpemuError(f"{ref!r}: module {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


def model_kind(name: str) -> str:
    """Return "lm" for token-input language models, "vision" for image classifiers (user factories: attribute
    `gpemu_kind` on the factory, default "vision"); "<lm>@<tokens>" is that language model at that length."""
    base, length = split_seq_len(name)
    if length is not None:
        if model_kind(base) != "lm":
            raise GpemuError(f"{name!r}: a sequence length (@{length}) applies to language models only, not {base!r}")
        seq_len(name)  # in range
        return "lm"
    if name in _LM_CONFIGS:
        return "lm"
    if _is_factory_ref(name):
        return str(getattr(_load_factory(name), "gpemu_kind", "vision"))
    if name in _torchvision_names():
        return "vision"
    raise UnknownNameError("model", name, list_models())


def build_model(name: str) -> nn.Module:
    """Return a freshly built model (random init, no weights downloaded) for a zoo name or "package.module:factory"."""
    base, length = split_seq_len(name)
    if length is not None:
        seq_len(name)  # in range
        return build_model(base)
    if name in _LM_CONFIGS:
        cfg = _LM_CONFIGS[name]
        return TransformerLM(causal=name == "gpt2", **cfg)
    if _is_factory_ref(name):
        model = _load_factory(name)()
        if not isinstance(model, nn.Module):
            raise GpemuError(f"{name!r} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    if name not in _torchvision_names():
        raise UnknownNameError("model", name, list_models())
    import torchvision

    kwargs: dict[str, object] = {"weights": None}
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = False
    return torchvision.models.get_model(name, **kwargs)


def example_batch(
    name: str, batch_size: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, targets): images Bx3x224x224 fp32 + class labels, or token ids B x seq_len(name) (512 unless
    the name says "@<tokens>") + next-token labels."""
    if batch_size < 1:
        raise GpemuError(f"batch size must be >= 1, got {batch_size}")
    if model_kind(name) == "lm":
        base, _ = split_seq_len(name)
        vocab = _LM_CONFIGS[base]["vocab"] if base in _LM_CONFIGS else 30522
        tokens = seq_len(name)
        ids = torch.randint(0, vocab, (batch_size, tokens), device=device)
        labels = torch.randint(0, vocab, (batch_size, tokens), device=device)
        return ids, labels
    images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,), device=device)
    return images, labels


def loss_fn(name: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Return the training loss for a zoo model's output (cross-entropy over classes or over the vocabulary)."""
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), targets.flatten())
    return F.cross_entropy(output, targets)


def parameter_count(model: nn.Module) -> int:
    """Return the number of parameters of a model."""
    return sum(math.prod(p.shape) for p in model.parameters())
