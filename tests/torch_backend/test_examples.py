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
