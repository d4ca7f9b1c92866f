"""The memory report: peak, persistent after a step, and the owners of memory at the peak, by module."""

from __future__ import annotations

import torch
from torch import nn

import gpemu.torch_backend as gt
from gpemu.report.memory import MemoryReport

MIB = 2**20


def test_memory_report_names_modules_and_persistent_state() -> None:
    emu = gt.install("v100")
    report = MemoryReport(emu.devices)
    try:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            report.on_step_boundary()
            x = torch.randn(4096, 1024).cuda()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        report.on_step_boundary()
        out = report.to_dict()["devices"][0]
    finally:
        report.close()
        gt.uninstall()
    # parameters: 1024*4096 + 4096 + 4096*10 + 10 = 4,239,370 floats = 16.17 MiB; grads and momentum the same again.
    weights_mib = 4_239_370 * 4 / MIB
    # Persistent = weights + grads + momentum + the last input batch (4096*1024*4 B = 16 MiB, still referenced by x)
    # + the cuBLAS workspaces of the forward and autograd threads (2 x 8.125 MiB on a V100: Note [cuBLAS workspace in
    # the drop-in]), listed under their own owner.
    workspaces_mib = 2 * (4096 * 1024 * 2 + 16 * 1024 * 8) / MIB
    assert 3 * weights_mib + 16 + workspaces_mib <= out["persistent_mib"] <= 3 * weights_mib + 16.5 + workspaces_mib
    assert {row["owner"]: row["mib"] for row in out["top_at_peak_mib"]}.get("cuBLAS workspaces") == workspaces_mib
    # At the peak (in backward) the ReLU's saved output, 4096*4096*4 B = 64 MiB, belongs to module "1".
    owners = {row["owner"]: row["mib"] for row in out["top_at_peak_mib"]}
    assert owners.get("1", 0.0) >= 64.0
    assert out["peak_allocated_mib"] > out["persistent_mib"]
