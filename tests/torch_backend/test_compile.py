"""torch.compile runs eager on the emulated GPU (Note [torch.compile under emulation]) and is restored afterwards."""

from __future__ import annotations

import pytest
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


class _Pointwise(torch.nn.Module):
    """Three pointwise ops on one tensor shape: eager runs three kernels, Inductor one."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))  # a parameter: the module is a model, not a loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


def _eval_gpu_s(compiled: bool) -> float:
    emu = gt.install("a100", replay=False)
    try:
        model = _Pointwise().cuda()
        if compiled:
            model = torch.compile(model)
        x = torch.randn(64, 1024, 1024, device="cuda")
        with torch.no_grad():
            model(x)  # the op costs are cached after the first call
            torch.cuda.synchronize()
            before = emu.devices[0].stats.work_s["kernel"]
            model(x)
            torch.cuda.synchronize()
        return emu.devices[0].stats.work_s["kernel"] - before
    finally:
        gt.uninstall()


def test_a_compiled_modules_pointwise_chain_is_priced_as_one_fused_kernel() -> None:
    # Note [Compiled regions]: mul, add and relu each read and write 64 x 1024 x 1024 fp32 (256 MiB each way) and
    # cost the same; fused, the group costs its most expensive op, so one third of the eager time
    eager, compiled = _eval_gpu_s(False), _eval_gpu_s(True)
    assert eager > 0
    assert compiled == pytest.approx(eager / 3, rel=1e-6)


def test_a_compiled_model_is_not_calibrated_to_eager_phase_targets() -> None:
    import torchvision

    emu = gt.install("a100", replay=False)
    try:
        model = torch.compile(torchvision.models.resnet18().cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 3, 224, 224, device="cuda")
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
        described = emu.phases.describe()
    finally:
        gt.uninstall()
    # resnet18 at 224 px would take gpemu predict's eager phase times (Note [Phase predictions]); compiled, it is
    # priced op by op with the fused groups
    assert described["compiled"] == ["resnet18"]
    assert described["phase_predicted"] == {} and described["calibrated"] == {}
    assert emu.phases.fusion.fused_ops > 0


def test_the_run_report_says_which_models_ran_compiled() -> None:
    from gpemu.report.summary import timing_line

    line = timing_line({"compute_s_by_source": {"predicted": 1.0}, "calibrated_pct": 0.0, "compiled": ["GPT"]})
    assert "torch.compile'd GPT: pointwise/norm/reduction chains priced as fused kernels" in line


def test_module_compile_method_marks_the_module_compiled() -> None:
    from gpemu.torch_backend.fusion import is_compiled

    gt.install("a100")
    try:
        model = torch.nn.Linear(4, 4).cuda()
        assert not is_compiled(model)
        model.compile()  # nn.Module.compile: torch.compile(self._call_impl), eager under gpemu
        assert is_compiled(model) and is_compiled(torch.nn.DataParallel(model))
        assert model(torch.randn(2, 4, device="cuda")).shape == (2, 4)
    finally:
        gt.uninstall()

