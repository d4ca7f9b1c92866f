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


def _resnet18_phases_s(compiled: bool, mode: str | None = None) -> tuple[list[float], list[float], dict[str, object]]:
    """Return the GPU time of each step's forward and of each step's backward + SGD step, and the phase summary."""
    import torchvision

    emu = gt.install("a100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda()
        if compiled:
            model = torch.compile(model, mode=mode)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 3, 224, 224, device="cuda")
        stats = emu.devices[0].stats

        def work_s() -> float:
            torch.cuda.synchronize()
            return stats.work_s["kernel"]

        forward_s, backward_s = [], []
        for _ in range(3):
            t0 = work_s()
            out = model(x)
            t1 = work_s()
            out.sum().backward()  # the sum is in the backward phase (Note [Work after the step] closes it)
            opt.step()
            backward_s.append(work_s() - t1)
            opt.zero_grad(set_to_none=True)
            forward_s.append(t1 - t0)
        return forward_s, backward_s, emu.phases.describe()
    finally:
        gt.uninstall()


def test_a_compiled_model_takes_the_eager_phase_time_times_its_fused_fraction() -> None:
    # resnet18 at 224 px has eager phase predictions (Note [Phase predictions]); step 1 is priced per op, later steps
    # are scaled to the targets (replay off: every step is priced per op first, and scaled by the last one's sum).
    # Note [Compiled regions]: a compiled phase takes target x (fused / unfused per-op sum of the last phase); the
    # eager step 3 is the target itself, and the fused and unfused sums are the per-op prices of the compiled and
    # eager step 1 (step 2 is scaled), so compiled step 3 = eager step 3 x compiled step 1 / eager step 1. Before the
    # fix, calibration was off for a compiled step: step 3 equalled step 1 (per op, fused), 0.71 ms instead of
    # 2.99 ms for the forward: 4.2x faster than the eager forward, where its per-op sums say 1.6x.
    eager_f, eager_b, _ = _resnet18_phases_s(False)
    comp_f, comp_b, described = _resnet18_phases_s(True)
    assert eager_f[2] != pytest.approx(eager_f[0], rel=0.05)  # the eager steps are scaled to the targets
    assert comp_f[2] == pytest.approx(eager_f[2] * comp_f[0] / eager_f[0], rel=1e-6)
    assert comp_b[2] == pytest.approx(eager_b[2] * comp_b[0] / eager_b[0], rel=1e-6)
    assert comp_f[2] < eager_f[2] and comp_b[2] < eager_b[2]
    assert described["compiled"] == ["resnet18"]


def test_a_model_compiled_with_cuda_graphs_runs_at_its_fused_kernel_prices() -> None:
    # Note [Compiled with CUDA graphs]: mode="reduce-overhead" replays the region from CUDA graphs, without the host
    # dispatch a phase target holds, so every step is priced per op with fusion: step 3 = step 1 = the default-mode
    # compiled step 1 (per op, before any calibration), below the default mode's calibrated step 3 (resnet18 at
    # batch 8 on an A100 is host-bound in the time model)
    comp_f, comp_b, _ = _resnet18_phases_s(True)
    graph_f, graph_b, described = _resnet18_phases_s(True, mode="reduce-overhead")
    assert graph_f[2] == pytest.approx(graph_f[0], rel=1e-6) and graph_b[2] == pytest.approx(graph_b[0], rel=1e-6)
    assert graph_f[2] == pytest.approx(comp_f[0], rel=1e-6) and graph_b[2] == pytest.approx(comp_b[0], rel=1e-6)
    assert graph_f[2] < comp_f[2] and graph_b[2] < comp_b[2]
    assert described["compiled"] == ["resnet18"]
    from gpemu.torch_backend.patches import compiles_cuda_graphs

    assert compiles_cuda_graphs({"mode": "max-autotune"}) and compiles_cuda_graphs({"options": {"triton.cudagraphs": True}})
    assert not compiles_cuda_graphs({"mode": "max-autotune-no-cudagraphs"}) and not compiles_cuda_graphs({})


def test_the_run_report_says_which_models_ran_compiled() -> None:
    from gpemu.report.summary import timing_line

    line = timing_line({"compute_s_by_source": {"predicted": 1.0}, "calibrated_pct": 0.0, "compiled": ["GPT"]})
    assert "torch.compile'd GPT: pointwise/norm/reduction chains priced as fused kernels" in line
    assert "eager targets" not in line  # no phase target: per op only
    line = timing_line({"compute_s_by_source": {"phase-predicted": 1.0}, "calibrated_pct": 0.0,
                        "compiled": ["resnet50"], "phase_predictions": {"resnet50/32/amp/forward": [0.0144, "spec"]}})
    assert line.endswith("its phases at the eager targets above times the fused / unfused per-op time")


def test_module_compile_method_marks_the_module_compiled() -> None:
    from gpemu.torch_backend.fusion import compiled_module

    gt.install("a100")
    try:
        model = torch.nn.Linear(4, 4).cuda()
        assert compiled_module(model) is None
        model.compile()  # nn.Module.compile: torch.compile(self._call_impl), eager under gpemu
        assert compiled_module(model) is model and compiled_module(torch.nn.DataParallel(model)) is model
        assert model(torch.randn(2, 4, device="cuda")).shape == (2, 4)
    finally:
        gt.uninstall()


class _TwoParams(torch.nn.Module):
    """out = relu((x * w1 + 1) * w2): in backward, w2's AccumulateGrad runs between w2's and w1's gradients."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.ones(shape))
        self.w2 = torch.nn.Parameter(torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu((x * self.w1 + 1.0) * self.w2)


def _beside_the_graph_s(compiled: bool) -> tuple[float, float, float]:
    """Return (the loss computed outside the model, the second backward minus the first, clip_grad_norm_) GPU s."""
    emu = gt.install("a100", replay=False)
    try:
        shape = (16, 1024, 1024)
        model = _TwoParams(shape).cuda()
        if compiled:
            model = torch.compile(model)
        x = torch.randn(shape, device="cuda")
        stats = emu.devices[0].stats

        def work_s() -> float:
            torch.cuda.synchronize()
            return stats.work_s["kernel"]

        for _ in range(2):  # op costs cached in the first pass
            model.zero_grad(set_to_none=True)
            backward_s = []
            for _ in range(2):  # the second backward adds into the gradients (AccumulateGrad: one add each)
                y = model(x)
                t0 = work_s()
                loss = torch.relu(y * 3.0).sum()  # eager under Inductor too: outside the compiled module
                t1 = work_s()
                loss.backward()
                backward_s.append(work_s() - t1)
            t2 = work_s()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # after the backward: eager kernels
            clip_s = work_s() - t2
        return t1 - t0, backward_s[1] - backward_s[0], clip_s
    finally:
        gt.uninstall()


def test_eager_kernels_beside_a_compiled_graph_are_priced_in_full() -> None:
    # Note [Compiled regions]: only the compiled forward and the backward of the nodes it made fuse. The loss's mul,
    # relu and sum run after the module returned; the second backward's two gradient adds run in AccumulateGrad
    # (w2's between w2's and w1's gradient kernels, so the compiled backward's group must stay open across it);
    # clip_grad_norm_'s norm, stack, reciprocal, clamp and scale run after the backward. Each costs its eager time,
    # so compiled equals eager for all three. Before the fix the loss's relu and sum were fused into its mul (0.10
    # of 0.29 ms left), the adds into the open group (0 of 0.30 ms), and clip_grad_norm_'s scalar chain into one
    # kernel (0.30 of 0.34 ms); with the adds closing the group, w1's gradient kernel was charged apart (0.44 ms).
    eager, compiled = _beside_the_graph_s(False), _beside_the_graph_s(True)
    assert min(eager) > 0
    assert compiled == pytest.approx(eager, rel=1e-6)


def test_a_compiled_model_in_a_wrapper_is_named_by_its_own_class() -> None:
    emu = gt.install("a100", replay=False)
    try:
        model = torch.nn.DataParallel(torch.compile(_TwoParams((4, 8)).cuda()))  # nanoGPT: DDP(torch.compile(m))
        model(torch.randn(4, 8, device="cuda")).sum().backward()
        described = emu.phases.describe()
    finally:
        gt.uninstall()
    assert described["compiled"] == ["_TwoParams"]  # was ["DataParallel"]: the run report named the wrapper


class _Blocks(torch.nn.Module):
    """Two blocks with an eager multiply between them: compiled one by one (regional compilation)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_TwoParams(shape), _TwoParams(shape)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](self.blocks[0](x) * 2.0)


def test_compiled_blocks_inside_an_uncompiled_model_fuse() -> None:
    shape = (16, 1024, 1024)
    emu = gt.install("a100", replay=False)
    try:
        stats = emu.devices[0].stats

        def work_s() -> float:
            torch.cuda.synchronize()
            return stats.work_s["kernel"]

        a, b = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
        unit_s = {}
        for name, op in (("mul", lambda: a * b), ("scale", lambda: a * 2.0), ("add", lambda: a + 1.0),
                         ("relu", lambda: torch.relu(a)),
                         ("relu_bwd", lambda: torch.ops.aten.threshold_backward(a, b, 0.0))):
            t0 = work_s()
            op()
            unit_s[name] = work_s() - t0
        model = _Blocks(shape).cuda()
        for block in model.blocks:
            block.compile()  # torchtitan / diffusers' compile_repeated_blocks style
        x, grad = torch.randn(shape, device="cuda"), torch.ones(shape, device="cuda")
        for _ in range(2):  # op costs cached in the first pass
            model.zero_grad(set_to_none=True)
            t0 = work_s()
            y = model(x)
            t1 = work_s()
            y.backward(grad)  # no loss: the backward pass alone
            t2 = work_s()
        described = emu.phases.describe()
    finally:
        gt.uninstall()
    m, scale = unit_s["mul"], unit_s["scale"]
    assert m >= max(unit_s["add"], unit_s["relu"]) and scale > 0
    # Note [Compiled regions]: each block's forward (mul, add, mul, relu) is one group at its dearest op, the
    # tensor-tensor mul m; the multiply between the blocks is eager: forward = 2 m + scale (eager: 2 x (2 m + add +
    # relu) + scale). Before the fix only a compiled top module fused: the blocks were priced eager.
    assert t1 - t0 == pytest.approx(2 * m + scale, rel=1e-6)
    # backward: per block relu's threshold_backward and the muls for the gradients of w2, h, w1 (and x in the second
    # block) form one group at max(threshold_backward, mul); the scale's backward (a multiply, an eager node) ends the
    # first block's group: 2 x max + scale
    bwd = max(unit_s["relu_bwd"], m)
    assert t2 - t1 == pytest.approx(2 * bwd + scale, rel=1e-6)
    assert described["compiled"] == ["_TwoParams"]


def _accumulating_steps_s(replay: bool) -> list[float]:
    """Return the kernel seconds of 6 compiled forward + backward calls that add into the same gradients."""
    emu = gt.install("a100", replay=replay)
    try:
        shape = (16, 1024, 1024)
        model = torch.compile(_TwoParams(shape).cuda())
        x = torch.randn(shape, device="cuda")
        stats = emu.devices[0].stats
        steps = []
        for _ in range(6):  # no zero_grad: calls 2-6 add into the gradients (gradient accumulation)
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            model(x).sum().backward()
            torch.cuda.synchronize()
            steps.append(stats.work_s["kernel"] - t0)
        assert (emu.replay.replayed if replay else 0) == (4 if replay else 0)  # calls 3-6 replay
        return steps
    finally:
        gt.uninstall()


def test_a_replayed_compiled_backward_prices_its_gradient_adds_in_full() -> None:
    # Note [Adds of a replayed backward]: the replayed backward adds into the existing gradients inside its own
    # autograd node, whose sequence number lies in the compiled forward's range, so the two adds of 16 * 1024 * 1024
    # fp32 gradients (64 MiB each) were priced into the fused backward group: a replayed call read 0.535 ms against
    # 0.683 ms per op. Per op they run in AccumulateGrad, priced in full.
    per_op = _accumulating_steps_s(replay=False)
    assert per_op[2] > per_op[0]  # the adds
    assert _accumulating_steps_s(replay=True) == pytest.approx(per_op, rel=1e-9)
