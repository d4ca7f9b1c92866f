"""torch.compile runs eager on the emulated GPU (Note [torch.compile under emulation]) and is restored afterwards."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt


def test_compiled_module_runs_eager_and_compile_is_restored() -> None:
    original = torch.compile
    emu = gt.install("a100")
    try:
        model = torch.nn.Linear(64, 32).cuda()
        compiled = torch.compile(model, mode="max-autotune")
        assert compiled is model  # eager: the module itself
        out = compiled(torch.randn(8, 64).cuda())
        assert out.shape == (8, 32) and out.is_cuda
        decorated = torch.compile(fullgraph=True)(lambda x: x * 2)  # decorator form
        assert decorated(out).shape == (8, 32)
        assert sum(emu.devices[0].stats.work_count.values()) > 0  # the Linear and the multiply were charged
    finally:
        gt.uninstall()
    assert torch.compile is original
