"""Hogwild idioms: `Module.share_memory()` on the emulated GPU and emulated tensors sent to other processes."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.errors import GpemuError
from gpemu.torch_backend import ipc

from .conftest import gpemu_run_script


def test_share_memory_is_a_no_op_on_the_device(emu: gt.Emulation) -> None:
    model = torch.nn.Linear(4, 3).cuda()
    before = torch.cuda.memory_allocated()
    assert model.share_memory() is model  # torch moved CPU storages to shared memory: "only available on CPU"
    assert all(isinstance(p, gt.EmuTensor) and p.is_shared() for p in model.parameters())
    assert torch.cuda.memory_allocated() == before


def test_sending_a_model_to_another_process_rebuilds_it_on_the_emulated_gpu(emu: gt.Emulation) -> None:
    # See Note [Emulated tensors across processes]: torch.multiprocessing pickles with ForkingPickler (CUDA IPC on a
    # GPU); the receiver gets emulated tensors of the same metadata, not CPU zeros whose fd was already closed
    model = torch.nn.Linear(256, 128).cuda()
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(model)
    before = torch.cuda.memory_allocated()
    received = pickle.loads(buf.getvalue())
    weight, bias = received.weight, received.bias
    assert isinstance(weight, torch.nn.Parameter) and isinstance(weight, gt.EmuTensor)
    assert weight.device == torch.device("cuda", 0) and weight.shape == (128, 256) and weight.requires_grad
    assert bias.shape == (128,)
    # 128 * 256 * 4 B = 131072 B (already a multiple of 512); 128 * 4 B = 512 B
    assert torch.cuda.memory_allocated() - before == 131072 + 512
    received(torch.randn(2, 256, device="cuda")).sum().backward()
    assert weight.grad is not None and weight.grad.shape == (128, 256)


def test_receiving_without_an_emulation_says_how_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPEMU_GPU", raising=False)
    with pytest.raises(GpemuError, match="gpemu run"):
        ipc.rebuild_emulated((2,), (1,), torch.float32, 0, False, False)


def test_hogwild_script_trains_in_spawned_processes_under_gpemu_run(tmp_path: Path) -> None:
    # end to end: each spawned trainer receives the emulated model, installs its own emulation and writes its own
    # report beside the parent's (r.pid<PID>.json), so the parent's r.json is not overwritten
    done = gpemu_run_script(tmp_path, "hogwild_train.py", "--report-json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("trained on cuda:0") == 2 and "done" in done.stdout
    children = sorted(tmp_path.glob("r.pid*.json"))
    assert len(children) == 2
    for child in children:  # no DataLoader: its 4 optimizer steps are the boundaries, 3 iterations between them
        rows = json.loads(child.read_text())["iterations"]
        assert len(rows) == 3 and all(row["gpu_busy_s"] > 0 for row in rows)
    assert json.loads((tmp_path / "r.json").read_text())["iterations"] == []  # the parent trained nothing


def test_trainers_started_by_mp_spawn_are_emulated(tmp_path: Path) -> None:
    # See Note [Spawned trainers]: the trainer is a multiprocessing child, which gpemu run's start-up hook used to leave
    # unemulated ("ProcessGroupNCCL is only supported with GPUs, no GPUs found!"); the resource tracker started
    # beside it stays native (no report of its own)
    script = Path(__file__).resolve().parent / "scripts" / "spawn_ddp_train.py"
    done = subprocess.run(
        [sys.executable, "-m", "gpemu", "run", "--gpu", "a100", "--report-json", str(tmp_path / "r.json"), "--",
         "python", str(script), "29677"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer 0 of 1 on cuda:0" in done.stdout and "done" in done.stdout
    children = list(tmp_path.glob("r.pid*.json"))
    assert len(children) == 1
    rows = json.loads(children[0].read_text())["iterations"]
    assert len(rows) == 3 and all(row["gpu_busy_s"] > 0 for row in rows)  # 4 optimizer steps: 3 iterations between
