"""examples/public_idioms/: scripts written in the idioms of popular public training scripts run unchanged under the
emulation (see each script's docstring for the repository it imitates)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpemu.torch_backend as gt

IDIOMS = Path(__file__).resolve().parents[2] / "examples" / "public_idioms"


def _run(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, object]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    return runpy.run_path(str(IDIOMS / script), run_name="__main__")


def _busy_s(emu: gt.Emulation) -> float:
    return emu.current_stream(0).t_done


def test_mnist(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("mnist.py", ["--save-model"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "device: cuda" in out
    assert out.count("Test set: Average loss") == 2  # --epochs 2
    assert out.count("Train Epoch:") == 4  # 32 samples / batch 8 = 4 batches, logged every 2, 2 epochs
    sd = torch.load(tmp_path / "mnist_cnn.pt")
    assert sd["fc1.weight"].shape == (128, 9216)  # 64 channels * 12 * 12 after pooling
    assert emu.devices[0].stats.h2d_bytes > 0


def test_dcgan(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("dcgan.py", ["--cuda", "--manualSeed", "1"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "[0/1][2/3] Loss_D" in out  # 12 samples / batch 4 = 3 iterations
    assert (tmp_path / "real_samples.png").stat().st_size > 0 and (tmp_path / "fake_samples_epoch_000.png").exists()
    netg = torch.load(tmp_path / "netG_epoch_0.pth")
    assert netg["main.0.weight"].shape == (16, 32, 4, 4)  # ConvTranspose2d(nz=16, ngf*4=32, 4)
    assert "main.1.num_batches_tracked" in netg


def test_vae(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("vae.py", [], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert out.count("====> Test set loss") == 2
    assert (tmp_path / "sample_2.png").exists() and (tmp_path / "reconstruction_1.png").exists()
    assert _busy_s(emu) > 0


def test_super_resolution_psnr_with_a_value_hook(
    emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    # PSNR = 10 * log10(1 / mse.item()) divides by a value: emulated values read 0 unless the value hook answers
    gt.set_value_hook(lambda shape, dtype, reason: 0.01 if dtype.is_floating_point and shape == () else None)
    try:
        ns = _run("super_resolution.py", ["--cuda"], monkeypatch, tmp_path)
    finally:
        gt.set_value_hook(None)
    out = capsys.readouterr().out
    assert out.count("Avg. PSNR: 20.0000 dB") == 2  # 10 * log10(1 / 0.01) = 20, 2 epochs
    monkeypatch.setattr(sys.modules["__main__"], "Net", ns["Net"], raising=False)  # the class the pickle names
    model = torch.load(tmp_path / "model_epoch_2.pth", weights_only=False)  # a whole pickled module
    assert model.conv4.weight.shape == (9, 32, 3, 3)  # upscale 3 -> 3**2 channels


def test_fast_neural_style(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("fast_neural_style.py", ["--accel"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "[6/6]" in out and "Done" in out
    # checkpoints every 2 batches, taken with transformer.eval().cpu() and moved back: 3 batches -> 1 checkpoint
    ckpts = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert ckpts == ["ckpt_epoch_0_batch_id_2.pth"]
    final = torch.load(tmp_path / "models" / "final.model")
    assert final["down.0.conv.weight"].shape == (8, 3, 9, 9)


def test_siamese(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("siamese.py", ["--save-model"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "Test set: Average loss" in out and out.count("Train Epoch") == 2  # 8 samples / batch 4
    sd = torch.load(tmp_path / "siamese_network.pt")
    assert sd["fc.0.weight"].shape == (256, 1024)  # 2 * resnet18's 512 features


def test_time_sequence_lbfgs(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("time_sequence.py", ["--steps", "2"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert out.count("prediction shape (3, 24)") == 2  # length 20 - 1 + future 5
    closures = int(out.split("closure calls")[1])
    assert closures >= 2  # LBFGS called the closure at least once per step


def test_forward_forward(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    _run("forward_forward.py", [], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert out.count("Loss:") == 6  # 2 layers * 3 epochs
    assert "train error:" in out


def test_nanogpt_train_resume_and_sample(
    emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.syspath_prepend(str(IDIOMS / "nanogpt"))  # `from model import GPT`, as `python train.py` allows
    monkeypatch.delitem(sys.modules, "model", raising=False)
    _run("nanogpt/train.py", [], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "iter 6:" in out and "sampled 9 tokens" in out  # max_iters 6; 1 prompt token + 8 sampled
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=False)
    assert ckpt["iter_num"] == 4  # eval_interval 4
    assert ckpt["model"]["lm_head.weight"].shape == (256, 64)
    assert len(ckpt["optimizer"]["state"]) == len(ckpt["model"]) - 1  # AdamW state per parameter; wte is tied to lm_head
    # resume from the checkpoint: continues at iter 4
    _run("nanogpt/train.py", ["--init_from=resume", "--max_iters=5"], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "step 4:" in out and "iter 5:" in out and "iter 3:" not in out
    peak_mib = float(out.split("max memory allocated")[1].split()[0])
    # at least the fp32 parameters (~0.12 M) + AdamW's two moments: 3 * 4 bytes * 0.12e6 = 1.4 MiB
    assert 1.4 < peak_mib < 100


@pytest.mark.parametrize("amp", [False, True])
def test_vision_classification_reference(
    emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys, amp: bool
) -> None:
    argv = ["--use-deterministic-algorithms", *(["--amp"] if amp else [])]
    _run("vision_classification.py", argv, monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "Not using distributed mode" in out
    assert out.count("Test: EMA Acc@1") == 2 and "evaluated 8" in out  # 2 epochs, 8 validation images
    ck = torch.load(tmp_path / "checkpoint.pth", weights_only=False)
    assert ck["epoch"] == 1 and ck["model"]["fc.weight"].shape == (10, 512)
    assert "n_averaged" in ck["model_ema"] and ck["model_ema"]["module.fc.weight"].shape == (10, 512)
    if amp:
        assert ck["scaler"]["scale"] == 65536.0  # 4 steps, finite gradients, growth_interval 2000: no growth yet
    # resume: the epoch counter is read back from the checkpoint, so nothing is left to train
    _run("vision_classification.py", [*argv, "--resume", "checkpoint.pth"], monkeypatch, tmp_path)
    assert "Epoch: [" not in capsys.readouterr().out
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    # resnet18 at 10 classes: 11.2 M parameters * 4 bytes = 43 MiB each for weights, grads, momentum and the EMA copy
    assert 4 * 43 < peak_mib < 1024


@pytest.mark.parametrize("fp16", [False, True])
def test_hf_style_loop(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys, fp16: bool) -> None:
    _run("hf_style_loop.py", ["--fp16"] if fp16 else [], monkeypatch, tmp_path)
    out = capsys.readouterr().out
    # 16 samples / batch 4 = 4 batches, accumulation 2 -> 2 optimizer steps per epoch, 2 epochs
    assert "global_step 4 skipped_steps 0" in out
    assert out.count("eval_accuracy") == 2
    state = torch.load(tmp_path / "output" / "training_state.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == 4  # the scheduler stepped after every optimizer step
    if fp16:
        assert state["scaler"]["scale"] == 65536.0
    assert float(out.split("peak_mem_mib")[1]) > 0


def test_nanogpt_under_gpemu_run(tmp_path: Path) -> None:
    # as the product is used: `gpemu run --gpu v100 -- python train.py` (v100: is_bf16_supported() is True there as on
    # the real card, so bf16 autocast with a disabled GradScaler: Note [bf16 before Ampere])
    proc = subprocess.run(
        [sys.executable, "-m", "gpemu", "run", "--gpu", "v100", "--report-json", str(tmp_path / "r.json"), "--",
         "python", str(IDIOMS / "nanogpt" / "train.py"), "--max_iters=4"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "iter 4:" in proc.stdout and "sampled 9 tokens" in proc.stdout
    rows = json.loads((tmp_path / "r.json").read_text())["iterations"]
    # no DataLoader: each optimizer.step() ends an iteration (iters 0..4 = 5 steps; warm-up/partial ones excluded)
    assert len(rows) >= 3 and all(row["gpu_busy_s"] > 0 for row in rows)


def test_cuda_stream_prefetcher(emu: gt.Emulation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    device = emu.devices[0]
    works: list = []
    remove = device.add_listener(type("L", (), {"on_work": lambda self, w: works.append(w),
                                                "on_host_wait": lambda self, *a: None})())
    try:
        _run("cuda_prefetcher.py", ["--batches", "4"], monkeypatch, tmp_path)
    finally:
        remove()
    out = capsys.readouterr().out
    assert "done 4 steps" in out
    default_id = emu.current_stream(0).stream_id
    # the image batches: 8 x 3 x 64 x 64 uint8 = 98,304 bytes each (the parameters are copied too, earlier)
    copies = [w for w in works if w.category == "h2d" and w.args.get("bytes") == 8 * 3 * 64 * 64]
    # 4 batches, each copied from pinned memory on the prefetcher's side stream, never on the default stream
    assert len(copies) == 4 and all(w.stream_id != default_id and w.args["pinned"] for w in copies)
    # the normalisation (uint8 -> float, sub_, div_: 3 kernels per batch) runs on the side stream too
    side_kernels = [w for w in works if w.category == "kernel" and w.stream_id != default_id]
    assert len(side_kernels) == 4 * 3
