"""The DataLoader fetch timer on a tiny real run, and the JSON report surviving Ctrl-C."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpemu.device.api import Emulator
from gpemu.report import reporting


class SlowDataset(Dataset[torch.Tensor]):
    """Each item takes `delay_s` of real host time (a stand-in for decode + augmentation)."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        return torch.zeros(3, 8, 8)


def test_dataloader_fetches_define_iterations(tmp_path: Path) -> None:
    emu = Emulator("v100")
    loader = DataLoader(SlowDataset(24, 0.005), batch_size=4, num_workers=0)
    out = tmp_path / "r.json"
    with reporting(emu.devices, json_path=out) as rep:
        for batch in loader:
            emu.h2d(batch.nbytes, pinned=False)
            emu.compute(0.010, "step")
            emu.synchronize()
    rows = rep.to_dict()["iterations"]
    assert len(rows) == 6  # 24 items / batch 4; the StopIteration fetch opens no iteration
    for row in rows:
        assert row["data_wait_s"] >= 0.020  # 4 items x 5 ms of real sleep
        assert row["gpu_busy_s"] == pytest.approx(0.010, abs=1e-6)  # the kernel lies wholly inside the window
        # wall = data wait + pageable copy (3*8*8*4*4 B = 3072 B at 4.3 GB/s, ~0.7 us) + kernel + host overheads
        assert row["wall_s"] >= row["data_wait_s"] + 0.010
        assert row["wall_s"] < row["data_wait_s"] + 0.010 + 0.010
        assert row["h2d_bytes"] == 3072
    saved = json.loads(out.read_text())
    assert saved["complete"] is True and len(saved["iterations"]) == 6
    assert saved["summary"]["iterations_used"] == 5  # warm-up skipped


def test_report_json_is_written_on_keyboard_interrupt(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    script = textwrap.dedent(
        f"""
        import torch
        from torch.utils.data import DataLoader
        from gpemu.device.api import Emulator
        from gpemu.report import install_report
        emu = Emulator("v100")
        install_report(emu.devices, json_path={str(out)!r}, print_summary=False)
        for i, batch in enumerate(DataLoader(torch.zeros(40, 2), batch_size=4)):
            emu.compute(0.002)
            emu.synchronize()
            if i == 5:
                raise KeyboardInterrupt
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    saved = json.loads(out.read_text())
    # 6 iterations started (i = 0..5); the last one was cut short and is flagged partial.
    assert len(saved["iterations"]) == 6
    assert saved["iterations"][-1]["partial"] is True
    assert not list(tmp_path.glob(".*.tmp"))  # the write was atomic: no temp file left behind


class SyncingDataset(Dataset[int]):
    """Each item waits for the emulated GPU's queued work (a stand-in for `sample.cuda()` from pageable memory in
    __getitem__, as lucidrains' x-transformers train_enwik8.py does), after `delay_s` of real host work."""

    def __init__(self, emu: Emulator, n: int, delay_s: float) -> None:
        self.emu, self.n, self.delay_s = emu, n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay_s)
        self.emu.synchronize()
        return i


def test_gpu_waits_inside_a_fetch_are_not_data_wait(tmp_path: Path) -> None:
    # Note [GPU waits inside a fetch]: each step queues 30 ms of GPU work and returns at once; the next fetch's item
    # blocks until it is done (~30 ms) after 2 ms of real loading. Before, the whole ~32 ms fetch was data wait
    # (fetch stall ~94 %); now the data wait is the ~2 ms of loading and the ~30 ms wait is the iteration's sync wait.
    emu = Emulator("v100")
    loader = DataLoader(SyncingDataset(emu, 6, 0.002), batch_size=1, num_workers=0)
    with reporting(emu.devices) as rep:
        for _batch in loader:
            emu.compute(0.030, "step")
    rows = rep.to_dict()["iterations"]
    assert len(rows) == 6
    for row in rows[1:]:  # each of these fetches waited for the previous step's 30 ms kernel
        assert 0.002 <= row["data_wait_s"] < 0.012
        assert row["sync_wait_s"] > 0.020
        assert row["fetch_stall_pct"] < 40.0


def test_each_loader_counts_its_own_epochs() -> None:
    # Note [Epochs per loader]: two training epochs of 3 batches, a one-batch validation pass after every training
    # step (milesial's Pytorch-UNet validates every step on small sets). Training iterations read epoch 1, 1, 1, 2, 2,
    # 2; the validation ones their pass number 1..6 (before: every loader pass began a new epoch, 1 to 12).
    emu = Emulator("v100")
    train = DataLoader(torch.zeros(3, 2), batch_size=1)
    val = DataLoader(torch.zeros(1, 2), batch_size=1)
    with reporting(emu.devices) as rep:
        for _epoch in range(2):
            for _batch in train:
                emu.compute(0.001, "step")
                for _v in val:
                    emu.compute(0.0005, "eval")
        emu.synchronize()
    epochs = [row["epoch"] for row in rep.to_dict()["iterations"]]
    assert epochs[0::2] == [1, 1, 1, 2, 2, 2]  # training fetches
    assert epochs[1::2] == [1, 2, 3, 4, 5, 6]  # validation passes
