"""Optimizer-step replay: steady-state steps are charged as a unit; hooks, schedulers and step counters still work."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import optim_replay


@pytest.fixture
def emu() -> Iterator[gt.Emulation]:
    e = gt.install("a100", replay=True)
    yield e
    gt.uninstall()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x = torch.randn(32, 256, device="cuda")
    for _ in range(steps):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()


def test_steady_state_steps_are_replayed_with_the_same_gpu_time(emu: gt.Emulation) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    posts: list[int] = []
    opt.register_step_post_hook(lambda *a: posts.append(1))
    before = optim_replay.replayed_steps
    _train(model, opt, 6)
    # step 1 allocates the momentum buffers (memory changes: not replayable), steps 2 and 3 record the same ops with
    # no memory change, so steps 4, 5 and 6 are replayed
    assert optim_replay.replayed_steps - before == 3
    assert len(posts) == 6  # torch's hook wrapper still runs around every step
    torch.cuda.synchronize()
    busy_replayed = emu.devices[0].busy_s()

    gt.uninstall()
    e2 = gt.install("a100", replay=False)
    model2 = _model()
    _train(model2, torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9), 6)
    torch.cuda.synchronize()
    # the same kernels were charged either way (predicted costs are deterministic): the GPU busy times agree to the
    # rounding of (start + d) - start at perf_counter magnitudes (~4e-12 s per kernel, ~1e-11 s over the run)
    assert e2.devices[0].busy_s() == pytest.approx(busy_replayed, abs=1e-9)


def test_adam_step_counters_advance_and_schedulers_count(emu: gt.Emulation) -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    before = optim_replay.replayed_steps
    x = torch.randn(32, 256, device="cuda")
    for _ in range(7):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    assert optim_replay.replayed_steps - before >= 3  # replay engaged
    steps = {float(s["step"]) for s in opt.state.values()}
    assert steps == {7.0}  # the CPU step counters advanced on replayed steps too
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)  # 7 scheduler steps, halving every 2


def test_a_changed_parameter_set_is_recorded_again(emu: gt.Emulation) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 5)
    before = optim_replay.replayed_steps
    model[2].weight.requires_grad_(False)  # fine-tuning style freeze: that parameter gets no gradient any more
    _train(model, opt, 1)
    assert optim_replay.replayed_steps == before  # a new key: recorded, not replayed


def test_zero_grad_frees_emulated_gradients_and_leaves_other_parameters_alone(emu: gt.Emulation) -> None:
    model = _model()
    cpu = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([*model.parameters()], lr=0.1)
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    alloc = emu.devices[0].allocator
    with_grads = alloc.memory_allocated()
    opt.zero_grad()  # every parameter emulated: the fast path (Note [Tensor attributes from Python])
    assert all(p.grad is None for p in model.parameters())
    # gradients of 256x256 + 256 + 10x256 + 10 floats = (65536 + 256 + 2560 + 10) * 4 bytes, each rounded up to a
    # multiple of 512: 262144 + 1024 + 10240 + 512 = 273920 bytes freed
    assert with_grads - alloc.memory_allocated() == 273920
    mixed = torch.optim.SGD([cpu, *model.parameters()], lr=0.1)  # a CPU parameter: torch's own path
    cpu.grad = torch.full((3,), 2.0)
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    mixed.zero_grad(set_to_none=False)
    assert torch.equal(cpu.grad, torch.zeros(3)) and all(p.grad is not None for p in model.parameters())


def test_a_step_given_closure_none_is_replayed(emu: gt.Emulation) -> None:
    # accelerate's AcceleratedOptimizer (transformers Trainer) steps through GradScaler.step(optimizer, None)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(32, 256, device="cuda")
    before = optim_replay.replayed_steps
    for _ in range(6):
        scaler.scale(model(x).sum()).backward()
        scaler.step(opt, None)
        scaler.update()
        opt.zero_grad()
    # step 1 allocates the moments, steps 2-3 record the same ops, steps 4-6 replay
    assert optim_replay.replayed_steps - before == 3
    assert optim_replay._has_arguments((lambda: 0.0,), {}) and optim_replay._has_arguments((), {"closure": min})
    assert not optim_replay._has_arguments((), {"closure": None}) and not optim_replay._has_arguments((), {})
