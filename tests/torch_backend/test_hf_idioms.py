"""Idioms of Hugging Face transformers and timm training scripts: first reproduced with plain torch (always run),
then with the libraries themselves when they are installed (they are not gpemu dependencies)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import gpemu.torch_backend as gt


@pytest.fixture
def a100() -> Iterator[gt.Emulation]:
    """Return an installed 1x A100 emulation; uninstall afterwards."""
    e = gt.install("a100")
    yield e
    gt.uninstall()


class _KwargsModel(nn.Module):
    """A model called as `model(**batch)` whose loss is computed inside forward (Hugging Face style)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.head = nn.Linear(32, 2)

    def forward(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(self.emb(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_keyword_only_model_calls_are_the_top_module_and_replay(a100: gt.Emulation) -> None:
    model = _KwargsModel().cuda()
    opt = torch.optim.AdamW(model.parameters())
    batch = {"input_ids": torch.randint(0, 100, (8, 16)).cuda(), "labels": torch.randint(0, 2, (8,)).cuda()}
    seen = []
    for _ in range(4):
        out = model(**batch)
        seen.append(a100.phases.steps)
        out["loss"].backward()
        opt.step()
        opt.zero_grad()
    # every call opens a training step (before the fix no module had a positional tensor: no step was ever seen)
    assert seen == [1, 2, 3, 4]
    assert a100.replay is not None
    # calls 1 and 2 record, 3 and 4 replay (the same counts as a positional call, test_replay.py)
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert a100.phases.pending_kwargs is None  # the batch is not kept alive by the tracker


def test_cuda_graph_classes_survive_import_time_use(a100: gt.Emulation) -> None:
    # transformers' continuous batching annotates `def get_graph(...) -> torch.cuda.CUDAGraph | None` at import
    hint = torch.cuda.CUDAGraph | None
    assert torch.cuda.CUDAGraph in hint.__args__
    assert issubclass(type("Graphs", (torch.cuda.CUDAGraph,), {}), torch.cuda.CUDAGraph)


def test_conv_with_bias_on_a_16_bit_input_under_autocast(a100: gt.Emulation) -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1).cuda()  # bias=True, as in ConvNeXt
    x = torch.randn(2, 8, 16, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        y = conv(x)
        z = conv(y)  # y is float16 and the bias float32: torch.conv2d's own check rejected this before the fix
        w = nn.functional.conv1d(torch.randn(2, 8, 16, device="cuda").half(), torch.randn(4, 8, 3, device="cuda"),
                                 torch.randn(4, device="cuda"))
    assert (y.dtype, z.dtype, w.dtype) == (torch.float16, torch.float16, torch.float16)
    z.float().sum().backward()
    assert conv.bias.grad is not None and conv.bias.grad.dtype == torch.float32  # the master bias stays fp32
    with pytest.raises(RuntimeError, match="bias type"):  # outside autocast torch's check stands
        conv(y)


def test_masks_built_from_host_values_read_back_their_real_values(a100: gt.Emulation) -> None:
    from torch.nn.modules.transformer import _detect_is_causal_mask

    # word_language_model: the mask is built on the host and copied; TransformerEncoder compares it with a causal
    # mask it builds on the device (torch.full + triu) and reads `(mask == causal).all()` back
    causal = nn.Transformer.generate_square_subsequent_mask(35).cuda()
    assert _detect_is_causal_mask(causal) is True  # read as False (zeros) before: the explicit-mask path ran
    assert _detect_is_causal_mask(torch.zeros(35, 35).cuda()) is False  # a mask that is not causal stays so
    assert torch.equal(causal, nn.Transformer.generate_square_subsequent_mask(35, device="cuda"))
    # transformers' sdpa_mask drops the mask when `padding_mask.all()`: true only without padding
    padded = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).cuda()
    assert bool(padded.bool().all()) is False  # the all() default (True) answered before
    assert bool(torch.ones(2, 4, dtype=torch.long).cuda().bool().all()) is True
    from gpemu.torch_backend.ops import known_sources

    assert len(known_sources(padded)) == 1 and known_sources(padded.bool()) == known_sources(padded)  # one copy
    assert known_sources(torch.arange(4, device="cuda") + 1) == frozenset()  # a constant: depends on no input
    # positions from arange through a comparison and a sum: 4 of the 16 pairs have j >= 3
    pos = torch.arange(4, device="cuda")
    assert int((pos[None, :] >= pos.new_full((4, 1), 3)).sum()) == 4
    # a model's math stays unknown: a weight over KNOWN_VALUE_MAX_BYTES (256 * 128 * 4 B = 128 KiB) is not copied
    # with its value, so nothing computed from it has one
    lin = nn.Linear(256, 128).cuda()
    assert lin(torch.ones(1, 256).cuda())[0, :2].tolist() == [0.0, 0.0]
