"""Acceptance: with in-memory data, an emulated resnet50 step on V100 takes the profiled forward + backward."""

from __future__ import annotations

import time

import pytest
import torch
import torchvision

import gpemu.torch_backend as gt

from .conftest import gpemu_tree_lookup


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [128, 256])
def test_resnet50_v100_iteration_matches_profile(shared_data, batch_size: int) -> None:
    lookup = gpemu_tree_lookup(shared_data)
    fwd_s = lookup("v100-pcie-32gb", "resnet50", "forward", batch_size, "fp32")
    bwd_s = lookup("v100-pcie-32gb", "resnet50", "backward", batch_size, "fp32")
    assert fwd_s and bwd_s  # b128: 0.1193 + 0.2655 s
    gt.install("v100", profile_lookup=lookup)
    try:
        model = torchvision.models.resnet50().cuda()  # identified by class name + parameter count
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        crit = torch.nn.CrossEntropyLoss()
        x = torch.randn(batch_size, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch_size,), device="cuda")
        iters, fwd_ms = [], []
        for i in range(6):  # min over 4 measured steps: a step the shared CI host starves is not the GPU
            start, mid = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            out = model(x)
            mid.record()
            loss = crit(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            if i >= 2:  # step 1 runs on predictions, step 2 pays momentum-buffer creation; see Note [Phase calibration]
                iters.append(time.perf_counter() - t0)
                fwd_ms.append(start.elapsed_time(mid))
        emu = gt.current_emulation()
        assert emu.phases.describe()["workloads"] == ["resnet50"]
        assert emu.replay is None or emu.replay.replayed == 4  # steps 1-2 record; 3-6 replay (GPEMU_REPLAY=0: none)
    finally:
        gt.uninstall()
    assert min(iters) == pytest.approx(fwd_s + bwd_s, rel=0.02)
    assert min(fwd_ms) / 1e3 == pytest.approx(fwd_s, rel=0.02)
