"""Tests for gpemu.workloads.models: the zoo names, offline transformer configs, user factories, example batches."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from gpemu.errors import UnknownNameError
from gpemu.workloads.models import build_model, example_batch, list_models, model_kind, parameter_count


def test_zoo_lists_torchvision_and_language_models() -> None:
    names = list_models()
    for name in ("resnet50", "vgg16", "mobilenet_v2", "vit_b_16", "bert-base", "gpt2"):
        assert name in names
    assert model_kind("resnet50") == "vision"
    assert model_kind("gpt2") == "lm"


def test_gpt2_and_bert_parameter_counts_match_published_configs() -> None:
    with torch.device("meta"):
        gpt2 = build_model("gpt2")
        bert = build_model("bert-base")
    # GPT-2 small: tok 50257*768 + pos 1024*768 + 12 layers * (qkv 768*2304+2304 + proj 768*768+768
    #   + fc1 768*3072+3072 + fc2 3072*768+768 + 2 LNs 4*768) + ln_f 2*768 = 124439808, + untied head bias 50257
    assert parameter_count(gpt2) == 124439808 + 50257
    # BERT-base: 30522*768 + 512*768 + 2*768 + emb LN 2*768 + 12 * 7087872 + MLM head 768*768+768 + 2*768 + 30522
    assert parameter_count(bert) == 23440896 + 393216 + 1536 + 1536 + 12 * 7087872 + 590592 + 1536 + 30522


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError, match="resnet50"):
        build_model("resnet5O")


def test_user_factory_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("h3_user_models")
    module.tiny = lambda: nn.Linear(4, 2)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "h3_user_models", module)
    model = build_model("h3_user_models:tiny")
    assert isinstance(model, nn.Linear)
    assert model_kind("h3_user_models:tiny") == "vision"


def test_example_batches_have_the_profiled_shapes() -> None:
    images, labels = example_batch("resnet50", 3, device="meta")
    assert (tuple(images.shape), images.dtype, tuple(labels.shape)) == ((3, 3, 224, 224), torch.float32, (3,))
    ids, targets = example_batch("gpt2", 2, device="meta")
    assert (tuple(ids.shape), ids.dtype, tuple(targets.shape)) == ((2, 512), torch.int64, (2, 512))
