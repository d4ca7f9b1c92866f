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


def test_dynamo_traces_host_code_under_emulation() -> None:
    # pytorch/tutorials torch_compile_tutorial.py: torch._dynamo.explain on CPU tensors died under gpemu with
    # "Handler already registered for <function current_stream>" (Note [Distinct accelerator functions])
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    def bar(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = a / (torch.abs(a) + 1)
        if b.sum() < 0:
            b = b * -1
        return x * b

    gt.install("a100")
    try:
        TorchInGraphFunctionVariable._get_handlers.cache_clear()  # built with gpemu's torch.cuda / accelerator
        torch._dynamo.reset()
        assert torch.accelerator.current_stream is not torch.cuda.current_stream
        assert torch.accelerator.synchronize is not torch.cuda.synchronize
        out = torch._dynamo.explain(bar)(torch.randn(10), torch.randn(10))
        assert out.graph_count == 2 and out.graph_break_count == 1  # the data-dependent `if` breaks the graph
    finally:
        gt.uninstall()
        TorchInGraphFunctionVariable._get_handlers.cache_clear()
        torch._dynamo.reset()
