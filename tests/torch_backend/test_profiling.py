"""torch.profiler under emulation: the emulated kernels are the profile's CUDA events (Note [Emulated kernels in
torch.profiler])."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import gpemu.torch_backend as gt


@pytest.fixture
def a100() -> gt.Emulation:
    e = gt.install("a100")
    yield e
    gt.uninstall()


def _busy_s(emu: gt.Emulation) -> float:
    return sum(emu.devices[0].stats.work_s.values())


def test_cuda_events_are_the_emulated_kernels(a100: gt.Emulation) -> None:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    busy_before_s = _busy_s(a100)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, record_function("step"):
        c = a @ b
        (c + 1).sum()
    busy_s = _busy_s(a100) - busy_before_s  # the device time of the 3 kernels launched in the profile
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    assert len(kernels) == 3  # mm, add, sum (before: no CUDA event at all)
    assert sum(k.device_time_total for k in kernels) == pytest.approx(busy_s * 1e6, rel=1e-6)
    # each kernel is also charged to the host op that launched it, and through it to its parents
    mm = next(e for e in events if e.name == "aten::mm")
    mm_kernel = next(k for k in kernels if "mm" in k.name)
    assert mm.self_device_time_total == pytest.approx(mm_kernel.device_time_total)
    # 2 * 2048^3 = 17179869184 FLOP at <= 312 TFLOP/s (the A100's fp16 tensor peak): at least 55 us
    assert mm_kernel.device_time_total >= 17179869184 / 312e12 * 1e6
    step = next(e for e in events if e.name == "step")
    assert step.device_time_total == pytest.approx(busy_s * 1e6, rel=1e-6)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=5)
    assert "Self CUDA" in table and "aten::mm" in table


def test_default_activities_include_cuda_and_cpu_only_profiles_have_no_device_time(a100: gt.Emulation) -> None:
    x = torch.randn(256, 256, device="cuda")
    with profile() as prof:  # torch's default: every supported activity, so CUDA on a GPU
        x @ x
    assert any(e.device_type == DeviceType.CUDA for e in prof.events())
    with profile(activities=[ProfilerActivity.CPU]) as cpu_prof:
        x @ x
    assert all(e.device_type == DeviceType.CPU for e in cpu_prof.events())
    assert "Self CUDA" not in cpu_prof.key_averages().table()


def test_scheduled_profiles_see_only_their_active_steps(a100: gt.Emulation) -> None:
    x = torch.randn(512, 512, device="cuda")
    counts: list[int] = []

    def ready(p: profile) -> None:
        counts.append(sum(e.device_type == DeviceType.CUDA for e in p.events()))

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule,
                 on_trace_ready=ready) as p:
        for _ in range(4):
            x @ x
            p.step()
    assert counts == [2]  # one matmul in each of the 2 active steps


def test_memory_timeline_export_says_why_it_writes_nothing(a100: gt.Emulation, tmp_path: object,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Linear(64, 64).cuda()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        model(torch.randn(8, 64, device="cuda"))
    prof.export_memory_timeline(f"{tmp_path}/memory_timeline.html")  # torch: ValueError, min() of no events
    assert "export_memory_timeline" in capfd.readouterr().err
