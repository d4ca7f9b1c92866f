"""BERT SQuAD fine-tuning as NVIDIA DeepLearningExamples' run_squad.py runs it, priced by gpemu (Lambda's rows).

DeepLearningExamples PyTorch/LanguageModeling/BERT (LambdaLabsML fork, run_squad.py; the scripts/run_squad.sh that
lambdal/deeplearning-benchmark calls) fine-tunes modeling.BertForQuestionAnswering: embeddings (word, position,
token type; vocabulary padded from 30522 to a multiple of 8, 30528) + layer norm, the encoder (post-LN layers with
eager attention: q/k/v projections, scores + the additive padding mask, softmax, dropout), and qa_outputs =
Linear(hidden, 2) split into start / end logits, loss = the mean of the two cross-entropies over the 384 positions
(max_seq_length 384 in run_squad.sh). "fp16" there is apex amp O2 (the model in fp16, FusedAdam on fp32 master
weights), priced here as gpemu's fp16 (the model cast to half; Adam on the half weights); "fp32" is BertAdam in
fp32, and on Ampere and later its matmuls run TF32 (the published A100 fp16 / fp32 ratio is 2.1-2.2 where the V100's,
without TF32, is 4.5-4.8: FP32 CUDA cores alone would make it ~5-16). The module is traced on meta by gpemu's op
tracer and priced with the packaged time model, forward and (loss + backward + optimizer step) as two phases, as
`gpemu predict` prices a training step. Not modelled: apex's fused layer norm and fused bias-GeLU kernels, fp32
master weights.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from _transformer_layers import BertLayer
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
from gpemu.workloads.optrace import trace_training_step

SEQ_LEN = 384  # run_squad.sh's max_seq_length
VOCAB = 30528  # bert-base/large-uncased's 30522, padded to a multiple of 8 by run_squad.py
# (hidden, layers, heads, ffn): Devlin et al. 2019, bert-base / bert-large (uncased) configs
CONFIGS = {"bert-base": (768, 12, 12, 3072), "bert-large": (1024, 24, 16, 4096)}
_COMPUTE = frozenset({"conv", "conv_grouped", "matmul", "attention"})


class BertForQuestionAnswering(nn.Module):
    """modeling.BertForQuestionAnswering of DeepLearningExamples: BERT encoder + a 2-logit span head."""

    def __init__(self, size: str) -> None:
        super().__init__()
        hidden, layers, heads, ffn = CONFIGS[size]
        self.tok, self.pos, self.typ = nn.Embedding(VOCAB, hidden), nn.Embedding(512, hidden), nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
        self.qa = nn.Linear(hidden, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return start and end logits stacked as (2 * batch, seq), so one cross-entropy is the mean of both."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(pos) + self.typ(torch.zeros_like(ids)))
        x = nn.functional.dropout(x, 0.1, self.training)
        mask = torch.zeros(ids.shape[0], 1, 1, ids.shape[1], device=ids.device, dtype=x.dtype)  # (1 - m) * -10000
        for layer in self.layers:
            x = layer(x, mask)[0]
        start, end = self.qa(x).split(1, dim=-1)
        return torch.cat([start.squeeze(-1), end.squeeze(-1)], 0)


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(batch, SEQ_LEN, dtype=torch.long, device="meta")
    return ids, torch.zeros(2 * batch, dtype=torch.long, device="meta")  # start and end positions


def predicted_sequences_per_s(size: str, gpu: str, dtype: str, batch: int, params: CostParams) -> float:
    """Return gpemu's training sequences per second of SQuAD fine-tuning (dtype fp32, tf32 or fp16)."""
    spec = get_gpu(gpu)
    with torch.device("meta"):
        model = BertForQuestionAnswering(size)
    records = trace_training_step(model, batch, "fp32" if dtype == "tf32" else dtype, "adam", inputs_fn=_inputs)
    ops = op_arrays(records)
    if dtype == "tf32":  # fp32 tensors, GEMMs on TF32 tensor cores (as gpemu.cost.predict.batch_linear_ops does)
        ops = replace(ops, dtype=["tf32" if c in _COMPUTE else d for c, d in zip(ops.category, ops.dtype,
                                                                                 strict=True)])
    ops = compress_views(ops)
    cols = spec_columns(ops, spec, params.tc_eff_for(spec), params.m_stream)
    p, f = params.shared, params.factors(spec)
    with torch.no_grad():
        kern = kernel_seconds(ops.flops, ops.bytes, cols, p, f)
        host = host_seconds(ops, p, f)
        fwd = torch.as_tensor(ops.phase == 0)
        seconds = phase_seconds(kern[fwd], host[fwd], p, "forward") + phase_seconds(kern[~fwd], host[~fwd], p,
                                                                                       "backward")
    return batch / float(seconds)
