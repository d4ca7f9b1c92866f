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


def test_a_language_model_name_carries_its_sequence_length() -> None:
    from gpemu.errors import GpemuError
    from gpemu.workloads.models import seq_len, split_seq_len

    # Note [Sequence length in the model name]
    assert split_seq_len("gpt2@1024") == ("gpt2", 1024)
    assert split_seq_len("gpt2") == ("gpt2", None)
    assert split_seq_len("pkg.mod:make_lm@256") == ("pkg.mod:make_lm", 256)
    assert (seq_len("gpt2"), seq_len("gpt2@1024"), seq_len("bert-base@128")) == (512, 1024, 128)
    ids, labels = example_batch("gpt2@1024", 2, device="meta")
    assert tuple(ids.shape) == tuple(labels.shape) == (2, 1024)
    assert model_kind("gpt2@64") == "lm"
    with pytest.raises(GpemuError, match="use 1 to 1024"):  # GPT-2 has 1024 positions
        seq_len("gpt2@2048")
    with pytest.raises(GpemuError, match="use 1 to 512"):  # BERT-base has 512
        model_kind("bert-base@1024")
    with pytest.raises(GpemuError, match="language models only"):
        model_kind("resnet50@224")


def test_predict_takes_a_sequence_length() -> None:
    import json

    from typer.testing import CliRunner

    from gpemu.cli.app import _register, app

    _register()
    runner = CliRunner()
    outs = {}
    for tokens in (256, 512):
        result = runner.invoke(app, ["predict", "-g", "a100", "-m", "gpt2", "-b", "64", "--dtype", "bf16",
                                     "--seq-len", str(tokens), "--json"])
        assert result.exit_code == 0, result.output
        outs[tokens] = json.loads(result.stdout)
    assert (outs[256]["model"], outs[256]["seq_len"]) == ("gpt2@256", 256)
    # 64 x 512 tokens is twice the work of 64 x 256 (attention a little more): the GPU-bound backward grows ~2x
    ratio = outs[512]["phases"]["backward"]["seconds"] / outs[256]["phases"]["backward"]["seconds"]
    assert 1.8 < ratio < 2.4
    # the input copy is 8-byte token ids: 64 x 512 x 8 = 262,144 bytes
    assert "64 x 4096 bytes" in outs[512]["phases"]["h2d"]["provenance"]
    bad = runner.invoke(app, ["predict", "-g", "a100", "-m", "gpt2", "-b", "8", "--seq-len", "4096"])
    assert bad.exit_code != 0 and "use 1 to 1024" in bad.output
