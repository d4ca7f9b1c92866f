"""GradScaler's scale stays known on the host; clip_grad_norm_ takes torch's foreach path on emulated gradients."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt


def _amp_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> float:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(2, 4, device="cuda")).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return scaler.get_scale()


def test_grad_scaler_scale_grows_as_on_a_gpu_with_finite_gradients(emu: gt.Emulation) -> None:
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=2)
    scales = [_amp_step(model, opt, scaler) for _ in range(5)]
    # finite gradients: the scale doubles every growth_interval=2 steps: 1024, 2048, 2048, 4096, 4096
    assert scales == [1024.0, 2048.0, 2048.0, 4096.0, 4096.0]
    assert int(scaler._growth_tracker.item()) == 1  # 5 steps = 2 growths + 1
    # Hugging Face's skipped-step check: scale_before <= scale_after means the optimizer ran
    before = scaler.get_scale()
    assert before <= _amp_step(model, opt, scaler)


def test_grad_scaler_state_dict_round_trips_the_scale(emu: gt.Emulation) -> None:
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=8.0, growth_interval=1)
    _amp_step(model, opt, scaler)
    assert scaler.state_dict()["scale"] == 16.0  # one growth: 8 * 2


@pytest.mark.parametrize("foreach", [None, True])
def test_clip_grad_norm_uses_foreach_kernels(emu: gt.Emulation, foreach: bool | None) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]).cuda()  # 8 parameters
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    names: list[str] = []
    stream = emu.current_stream(0)
    orig = stream.enqueue

    def spy(duration_s: float, name: str, *args: object, **kwargs: object) -> object:
        names.append(name)
        return orig(duration_s, name, *args, **kwargs)

    stream.enqueue = spy  # type: ignore[method-assign]
    try:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)
    finally:
        del stream.enqueue
    assert norm.device.type == "cuda" and norm.shape == ()
    # one _foreach_norm over the 8 gradients (not 8 vector_norm kernels) and one _foreach_mul_ to scale them
    assert names.count("_foreach_norm.Scalar") == 1 and names.count("linalg_vector_norm.default") == 1
    assert sum(n.startswith("_foreach_mul_") for n in names) == 1, names


def test_float_value_reads_and_grad_scaler_keeps_stepping() -> None:
    emu = gt.install("a100", float_value=1.0)
    try:
        model = torch.nn.Linear(4, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        assert loss.item() == 1.0  # computed floating-point values read back as float_value
        assert torch.randint(0, 3, (5,), device="cuda").sum().item() == 0  # integers stay 0
        assert not bool(torch.isnan(loss))  # bool reads stay False
        scaler = torch.amp.GradScaler("cuda", init_scale=4.0, growth_interval=1)
        for _ in range(2):
            _amp_step(model, opt, scaler)
        # found_inf reads 0 (finite gradients): both steps ran (momentum buffers exist) and the scale grew 4 -> 16
        assert scaler.get_scale() == 16.0
        assert all("momentum_buffer" in opt.state[p] for p in model.parameters())
        assert emu.float_value == 1.0
    finally:
        gt.uninstall()


def test_unscaling_reads_and_writes_every_gradient(emu: gt.Emulation) -> None:
    # Note [Unscaling gradients]: GradScaler.unscale_ was a fixed 2 us kernel whatever the gradients; it is the traffic
    # of `_foreach_mul_(grads, inv_scale)`: 4 x 2048 x 2048 fp32 = 64 MiB read and written
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(4)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(8, 2048, device="cuda")).float().sum()
    scaler.scale(loss).backward()
    dev = emu.devices[0]
    grads = [p.grad for p in model.parameters()]

    def busy(fn) -> float:  # type: ignore[no-untyped-def]
        torch.cuda.synchronize()
        before = dev.busy_s()
        fn()
        torch.cuda.synchronize()
        return dev.busy_s() - before

    found_inf, inv_scale = torch.zeros(1, device="cuda"), torch.ones(1, device="cuda")  # what unscale_ passes
    unscale_s = busy(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale))
    mul_s = busy(lambda: torch._foreach_mul_(grads, 0.5))
    assert unscale_s == pytest.approx(mul_s, rel=1e-6)
    # 128 MiB of traffic on the V100's 900 GB/s: well over 0.1 ms (it was 2 us)
    assert unscale_s > 134e6 / 900e9
    scaler.unscale_(opt)  # the scaler's own call reaches the same op
    assert found_inf.item() == 0 and scaler._found_inf_per_device(opt)[torch.device("cuda", 0)].item() == 0
