"""Transformer layers as HF transformers built them in 2022 (eager attention), priced by gpemu for layer benchmarks.

mli/transformers-benchmarks' micro_bench.ipynb times one `BertLayer` (bert-large config) and one `GPT2Block`
(gpt2-medium config) in fp16 (`.half()`, train mode, so dropout runs) with torch.utils.benchmark: `layer(X)` and
`layer(X)[0].sum().backward()` over a batch x sequence grid, and reports TFLOPS = its FLOP formula / time. The
modules below reproduce those layers op for op in plain torch (no `transformers` dependency): separate q/k/v
projections, scores = q @ k^T / sqrt(d), softmax, dropout, @ v (BERT); fused c_attn (addmm), a causal torch.where
mask, NewGELU written out as tanh arithmetic (GPT-2). They are traced on meta by gpemu's op tracer and priced with
the packaged time model (kernel times and the host dispatch model, no per-phase t0: a benchmark loop has none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gpemu.cost.model import (
    CostParams,
    compress_views,
    host_seconds,
    kernel_seconds,
    op_arrays,
    phase_seconds,
    spec_columns,
)
from gpemu.hardware import get_gpu
from gpemu.workloads.optrace import _Recorder, _routing

HIDDEN, HEADS, FFN = 1024, 16, 4096  # bert-large and gpt2-medium share these (published configs)


class BertLayer(nn.Module):
    """transformers' BertLayer (post-LN, eager attention, dropout 0.1); bert-large's config unless given another
    (bench/_bert_squad.py builds bert-base's). `mask`, when given, is added to the attention scores (an additive
    padding mask, as BERT fine-tuning scripts pass one)."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, ffn: int = FFN) -> None:
        super().__init__()
        self.hidden, self.heads = hidden, heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o, self.ln1 = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.inter, self.out, self.ln2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden), nn.LayerNorm(hidden)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.hidden // self.heads).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        """Return the layer output in a 1-tuple, as transformers does."""
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hidden // self.heads)
        if mask is not None:
            scores = scores + mask
        probs = F.dropout(F.softmax(scores, dim=-1), 0.1, self.training)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(x.shape)
        a = self.ln1(F.dropout(self.o(ctx), 0.1, self.training) + x)
        i = F.gelu(self.inter(a))
        return (self.ln2(F.dropout(self.out(i), 0.1, self.training) + a),)


class GPT2Block(nn.Module):
    """transformers' GPT2Block (pre-LN, Conv1D = addmm, causal torch.where mask, NewGELU) for gpt2-medium."""

    def __init__(self, positions: int = 1024) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.c_attn_w, self.c_attn_b = nn.Parameter(torch.empty(HIDDEN, 3 * HIDDEN)), nn.Parameter(torch.empty(3 * HIDDEN))
        self.c_proj_w, self.c_proj_b = nn.Parameter(torch.empty(HIDDEN, HIDDEN)), nn.Parameter(torch.empty(HIDDEN))
        self.fc_w, self.fc_b = nn.Parameter(torch.empty(HIDDEN, FFN)), nn.Parameter(torch.empty(FFN))
        self.proj_w, self.proj_b = nn.Parameter(torch.empty(FFN, HIDDEN)), nn.Parameter(torch.empty(HIDDEN))
        self.register_buffer("bias", torch.ones(positions, positions, dtype=torch.bool).tril().view(
            1, 1, positions, positions))

    @staticmethod
    def _conv1d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b, x.view(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        bsz, s, _ = x.shape
        q, k, v = self._conv1d(x, self.c_attn_w, self.c_attn_b).split(HIDDEN, dim=2)
        q, k, v = (t.view(bsz, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        mask = self.bias[:, :, :s, :s]
        w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device))
        w = F.dropout(F.softmax(w, dim=-1).type(v.dtype), 0.1, self.training)
        y = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(bsz, s, HIDDEN)
        return F.dropout(self._conv1d(y, self.c_proj_w, self.c_proj_b), 0.1, self.training)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        """Return the block output in a 1-tuple, as transformers does."""
        x = x + self._attn(self.ln1(x))
        h = self._conv1d(self.ln2(x), self.fc_w, self.fc_b)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return (x + F.dropout(self._conv1d(h, self.proj_w, self.proj_b), 0.1, self.training),)


LAYERS = {"bert-large layer": BertLayer, "gpt2-medium block": GPT2Block}


def layer_flops(batch: int, seq: int) -> float:
    """Return micro_bench.ipynb's forward FLOP formula: FFN 16bsh^2 + attention 4bhs^2 + 8bsh^2."""
    h = HIDDEN
    return 16 * batch * seq * h * h + 4 * batch * h * seq * seq + 8 * batch * seq * h * h


def trace_layer(name: str, batch: int, seq: int) -> list:
    """Return the gpemu op records of `layer(X)[0].sum().backward()` on meta (fp16, train mode, grads accumulated
    into existing .grad tensors as in a repeated benchmark loop); forward ops have phase "forward"."""
    with torch.device("meta"):
        layer = LAYERS[name]().half().train()
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)  # the timed loop's second and later backward passes accumulate
    x = torch.empty(batch, seq, HIDDEN, device="meta", dtype=torch.float16)
    recorder = _Recorder()
    with _routing(None), recorder:
        out = layer(x)[0]
        recorder.phase = "backward"
        out.sum().backward()
    return recorder.records


def predicted_seconds(name: str, gpu: str, batch: int, seq: int, params: CostParams) -> tuple[float, float]:
    """Return (forward, forward + backward) seconds of one layer call as gpemu predicts them."""
    spec = get_gpu(gpu)
    p = {**params.shared, "t0": 0.0, "t0_bwd": 0.0}
    f = params.factors(spec)
    ops = compress_views(op_arrays(trace_layer(name, batch, seq)))
    cols = spec_columns(ops, spec, params.tc_eff_for(spec), params.m_stream)
    with torch.no_grad():
        kern = kernel_seconds(ops.flops, ops.bytes, cols, p, f)
        host = host_seconds(ops, p, f)
        fwd = ops.phase == 0
        t_fwd = phase_seconds(kern[torch.as_tensor(fwd)], host[torch.as_tensor(fwd)], p, "forward")
        t_all = phase_seconds(kern, host, p, "backward")
    return float(t_fwd), float(t_all)


def best_tflops(name: str, gpu: str, seqs: Sequence[int], batches: Sequence[int],
                params: CostParams) -> tuple[float, float, str, str]:
    """Return gpemu's best (forward, forward+backward) TFLOPS over the grid, and where each best is."""
    best_f, best_a, at_f, at_a = 0.0, 0.0, "", ""
    for s in seqs:
        for b in batches:
            t_f, t_a = predicted_seconds(name, gpu, b, s, params)
            flops = layer_flops(b, s)
            tf_f, tf_a = flops / t_f / 1e12, 3 * flops / t_a / 1e12
            if tf_f > best_f:
                best_f, at_f = tf_f, f"b{b} s{s}"
            if tf_a > best_a:
                best_a, at_a = tf_a, f"b{b} s{s}"
    return best_f, best_a, at_f, at_a

