"""The examples/ scripts (no gpemu import inside) run unchanged under install()."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

import gpemu.torch_backend as gt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")


def test_imagenet_main(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("imagenet/main.py", ["--dummy", "-b", "4", "--iters", "2", "--workers", "0", "-p", "1", "--image-size", "64",
                              "--checkpoint", "ck.pth"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "using device cuda" in out and "Epoch [0][1]" in out and "done" in out
    ckpt = torch.load(tmp_path / "ck.pth")
    assert ckpt["state_dict"]["module.fc.weight"].shape == (1000, 512)  # resnet18 head, DataParallel prefix
    assert emu.devices[0].stats.h2d_bytes > 0


def test_amp_adamw(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("amp_adamw.py", ["--iters", "2", "--width", "128"], monkeypatch, tmp_path)
    amp_peak = float(capsys.readouterr().out.split("peak_mem_mib")[1])
    torch.cuda.reset_peak_memory_stats()
    _run("amp_adamw.py", ["--iters", "2", "--width", "128", "--no-amp"], monkeypatch, tmp_path)
    assert "ms/iter" in capsys.readouterr().out
    assert amp_peak > 0


def test_transformer_lm(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("transformer_lm.py", ["--iters", "2", "--seq", "16", "--d-model", "32", "--vocab", "100"], monkeypatch, tmp_path)
    assert "done" in capsys.readouterr().out


def test_cuda_event_timing(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("cuda_event_timing.py", ["--batch-size", "2", "--iters", "1", "--warmup", "1"], monkeypatch, tmp_path)
    fwd_ms = float(capsys.readouterr().out.split()[1])
    assert fwd_ms > 0


def test_hf_bert_finetune_no_trainer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    e = gt.install("a100")
    try:
        _run("hf/bert_finetune_no_trainer.py", ["--num_hidden_layers", "1", "--max_length", "16",
                                                "--num_train_samples", "48", "--num_eval_samples", "16",
                                                "--per_device_train_batch_size", "8", "--max_train_steps", "6",
                                                "--num_workers", "0"], monkeypatch, tmp_path)
        out = capsys.readouterr().out
        assert "step 5 loss" in out and "accuracy" in out and "peak memory" in out
        # 6 steps of 48 / 8 = one epoch: phases saw every training call (model(**batch)) and the 2 eval batches
        assert e.phases.steps == 6
    finally:
        gt.uninstall()


def test_hf_gpt2_clm_no_trainer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    e = gt.install("a100")
    try:
        _run("hf/gpt2_clm_no_trainer.py", ["--n_layer", "1", "--block_size", "64", "--num_train_tokens", "4000",
                                           "--per_device_train_batch_size", "4", "--max_train_steps", "5"],
             monkeypatch, tmp_path)
        assert "perplexity" in capsys.readouterr().out
        assert e.replay is not None and e.replay.replayed >= 3  # steps 3-5 replay (steps 1 and 2 record)
    finally:
        gt.uninstall()


def test_hf_bert_trainer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    gt.install("a100")
    try:
        _run("hf/bert_trainer.py", ["--num_hidden_layers", "1", "--seq_len", "16", "--max_steps", "3",
                                    "--per_device_train_batch_size", "8", "--dataloader_num_workers", "0",
                                    "--output_dir", str(tmp_path / "out")], monkeypatch, tmp_path)
        out = capsys.readouterr().out
        assert "train_runtime" in out and "eval_accuracy" in out  # accelerate's eval gather/pad reads real sizes
    finally:
        gt.uninstall()


def test_timm_train_synthetic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    pytest.importorskip("timm")
    gt.install("a100")
    try:
        _run("timm/train_synthetic.py", ["--model", "convnext_atto", "-b", "2", "--img-size", "64", "--steps", "4",
                                         "--num-classes", "10", "--channels-last", "--model-ema"], monkeypatch, tmp_path)
        assert "step 4 loss" in capsys.readouterr().out
    finally:
        gt.uninstall()
