"""Host CPU cost of emulation: ms of host CPU per training step and us per aten op (resnet18, resnet50, transformer).

Run: .venv/bin/python bench/host_overhead.py [--steps 5] [--batch-size 32]
Prints process CPU time per step (not wall time: the emulated GPU's sleeps cost no CPU) and per aten op, first on the
per-op path (replay=False), then with the whole-module replay path (replay=True). Two columns each: "total" is all
process CPU; "excl" leaves out the CPU spent inside EmulatedGPU.host_wait (yield-spinning in precise waits when the
launch queue is full or at a sync: a real CUDA host spins there too, so it is not emulator overhead). The targets
(issue #3: <= 25 us/op per op, <= 2 ms/step with replay) apply to "excl". With replay, "us/op" is the step's
CPU divided by the ops the per-op step dispatches (the ops the step stands for); "ops" is what it still dispatches
(loss, optimizer, zero_grad, AccumulateGrad outside the replayed module).
--queue-depth N sets the emulated launch-queue depth (default: the device's, 1024): a depth the steps never fill
(e.g. 1000000) means the host never sleeps on a full queue, which on a shared VM slows the CPU work after each sleep;
a diagnosis setting that separates the emulator's CPU from that effect, not how a GPU behaves.
The "never full" column repeats the replay run with a launch queue the steps never fill (as --queue-depth 1000000):
the emulator's own CPU with no sleep before it. The "idle" column repeats that run with a 30 ms sleep before each
step (outside the CPU count): the same emulator work, run after an idle spell as a GPU-bound step's is; where it
reads as the default-queue column, the difference from "never full" is the host's, not the emulator's. Two host figures follow the table, to read it by: how much slower a
fixed piece of Python runs right after a 5 ms sleep than back to back on this host (the default-queue replay column
sleeps once or more per GPU-bound step, and the CPU work after each sleep pays that), and the floor of the design:
the CPU per dispatched op of a tensor subclass whose `__torch_dispatch__` does no work at all (it returns a premade
wrapper), with autograd, i.e. what torch itself spends per op before gpemu does anything.
--phases also prints, per model and path, the CPU of each part of a step (forward, loss, backward, optimizer step,
zero_grad; without host_wait), the minimum over the measured steps.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import torch
import torchvision

import gpemu.torch_backend as gt
from gpemu.device.gpu import EmulatedGPU
from gpemu.torch_backend import tensor as emu_tensor


def _transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    return torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 6), torch.nn.Linear(512, 1000))


class _WaitMeter:
    """Counts process CPU spent inside EmulatedGPU.host_wait while installed."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self._orig = EmulatedGPU.host_wait

    def __enter__(self) -> _WaitMeter:
        orig = self._orig

        def host_wait(gpu: EmulatedGPU, *args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return orig(gpu, *args, **kwargs)
            finally:
                self.cpu_s += time.process_time() - c0

        EmulatedGPU.host_wait = host_wait  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        EmulatedGPU.host_wait = self._orig  # type: ignore[method-assign]


def step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """One training step: forward, loss, backward, optimizer step, zero_grad."""
    out = model(x)
    out.float().mean().backward()
    opt.step()
    opt.zero_grad()


PHASES = ("forward", "loss", "backward", "step", "zero_grad")


def timed_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, meter: _WaitMeter) -> list[float]:
    """Run step_fn's parts one by one; return the CPU seconds of each (CPU inside host_wait left out)."""

    def cpu_s() -> float:
        return time.process_time() - meter.cpu_s

    marks = [cpu_s()]
    out = model(x)
    marks.append(cpu_s())
    loss = out.float().mean()
    marks.append(cpu_s())
    loss.backward()
    marks.append(cpu_s())
    opt.step()
    marks.append(cpu_s())
    opt.zero_grad()
    marks.append(cpu_s())
    return [b - a for a, b in itertools.pairwise(marks)]


def _setup(name: str, batch_size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """Return the model on the emulated GPU, its SGD optimizer and an input batch."""
    model = (torchvision.models.get_model(name) if name != "transformer" else _transformer()).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    shape = (batch_size, 3, 224, 224) if name != "transformer" else (batch_size, 128, 512)
    return model, opt, torch.randn(*shape, device="cuda")


def measure(name: str, steps: int, batch_size: int, replay: bool, queue_depth: int | None = None,
            phases: list[float] | None = None, idle_s: float = 0.0) -> tuple[float, float, int]:
    """Return (host CPU ms/step, the same without CPU inside host_wait, aten ops dispatched per step); with
    `phases`, then run `steps` more steps part by part and fill it with each part's minimum ms (see PHASES).
    `idle_s` > 0 sleeps that long before each measured step (a sleep costs no CPU; what follows it may)."""
    emu = gt.install("a100", replay=replay)
    try:
        if queue_depth is not None:
            for dev in emu.devices:
                dev.launch_queue_depth = queue_depth
        model, opt, x = _setup(name, batch_size)
        # aten ops = outermost __torch_dispatch__ calls (Note [Emulator host time]): counting calls of run_op
        # missed the ops that a handler passes on to it (in-place scalar arithmetic: BatchNorm's
        # num_batches_tracked += 1, a residual `out += identity`)
        for _ in range(3):  # steps 1-2 record the replay; step 3 is the first replayed
            step_fn(model, opt, x)
        torch.cuda.synchronize()
        ops0 = emu_tensor.emulator_host_time()[1]
        with _WaitMeter() as meter:
            cpu0 = time.process_time()
            for _ in range(steps):
                if idle_s:
                    time.sleep(idle_s)
                step_fn(model, opt, x)
            cpu_s = time.process_time() - cpu0
        ops = emu_tensor.emulator_host_time()[1] - ops0
        if replay:
            assert emu.replay is not None and emu.replay.replayed >= steps, "replay did not engage"
        if phases is not None:
            with _WaitMeter() as meter:
                parts = [timed_step(model, opt, x, meter) for _ in range(steps)]
            phases[:] = [min(p[i] for p in parts) * 1e3 for i in range(len(PHASES))]
        return cpu_s / steps * 1e3, (cpu_s - meter.cpu_s) / steps * 1e3, ops // steps
    finally:
        gt.uninstall()


NEVER_FULL = 10**9  # a launch-queue depth no step fills
IDLE_S = 0.03  # the "idle" column: the never-full replay with the host asleep this long before each step


def post_sleep_slowdown(repeats: int = 200) -> float:
    """Return how many times slower a fixed ~0.1 ms piece of Python runs right after a 5 ms sleep than back to back
    (medians of `repeats`): on a shared VM the CPU work that follows a sleep is slower (cold caches, clock)."""

    def work() -> int:
        total = 0
        for i in range(3000):
            total += i * i
        return total

    def median_after(before: Any) -> float:
        times = []
        for _ in range(repeats):
            before()
            c0 = time.process_time_ns()
            work()
            times.append(time.process_time_ns() - c0)
        return sorted(times)[len(times) // 2]

    return median_after(lambda: time.sleep(0.005)) / median_after(lambda: None)


class _Inert(torch.Tensor):
    """A wrapper subclass whose __torch_dispatch__ does no work: the floor of any __torch_dispatch__ design."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    dispatched = 0

    @staticmethod
    def __new__(cls, shape: tuple[int, ...]) -> _Inert:
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=torch.device("meta"))  # type: ignore[no-any-return]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        _Inert.dispatched += 1
        if func is torch.ops.aten.sum.default:
            return _Inert(())
        if func is torch.ops.aten.expand.default:
            return _Inert(tuple(args[1]))
        return _Inert(tuple(args[0].shape))  # elementwise ops and their gradients: the first argument's shape


def dispatch_floor_us(iters: int = 2000) -> float:
    """Return host CPU us per dispatched op of _Inert over a small forward + backward (x*y+x, *2, sum)."""
    x, y = _Inert((32, 1000)).requires_grad_(), _Inert((32, 1000)).requires_grad_()

    def body() -> None:
        ((x * y + x) * 2.0).sum().backward(_Inert(()))
        x.grad = y.grad = None

    for _ in range(50):
        body()
    _Inert.dispatched = 0
    c0 = time.process_time()
    for _ in range(iters):
        body()
    return (time.process_time() - c0) / _Inert.dispatched * 1e6


def python_calls_per_step(name: str, batch_size: int, steps: int = 5) -> int:
    """Return the Python-level calls (functions and built-ins, as cProfile counts them) of one replayed step: a count
    that does not move with the host's speed or load, unlike the CPU columns."""
    import cProfile
    import pstats

    emu = gt.install("a100", replay=True)
    try:
        for dev in emu.devices:
            dev.launch_queue_depth = NEVER_FULL
        model, opt, x = _setup(name, batch_size)
        for _ in range(4):
            step_fn(model, opt, x)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(steps):
            step_fn(model, opt, x)
        profile.disable()
        return int(pstats.Stats(profile).total_calls) // steps
    finally:
        gt.uninstall()


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--queue-depth", type=int, default=None, help="emulated launch-queue depth (diagnosis only)")
    p.add_argument("--phases", action="store_true", help="also print each part of a step's CPU (min ms)")
    args = p.parse_args()
    parts: dict[str, list[float]] = {}
    print(f"{'':<12} {'':>8} | {'per-op path: ms/step':^26} | {'replay: ms/step':^26} | {'never full':^12} |"
          f" {'idle':>6} |")
    print(f"{'model':<12} {'ops/step':>8} | {'total':>6} {'excl':>6} {'us/op':>5} {'excl':>5} |"
          f" {'total':>6} {'excl':>6} {'us/op':>5} {'excl':>5} | {'excl':>5} {'us/op':>6} | {'excl':>6} |"
          f" {'ops':>5} {'speedup':>7} {'calls':>6}")
    for name in ("resnet18", "resnet50", "transformer"):
        per_op_parts: list[float] | None = [] if args.phases else None
        replay_parts: list[float] | None = [] if args.phases else None
        if per_op_parts is not None and replay_parts is not None:
            parts[f"{name} per-op"], parts[f"{name} replay"] = per_op_parts, replay_parts
        ms, ms_x, ops = measure(name, args.steps, args.batch_size, False, args.queue_depth, per_op_parts)
        rms, rms_x, rops = measure(name, args.steps, args.batch_size, True, args.queue_depth, replay_parts)
        _nms, nms_x, _nops = measure(name, args.steps, args.batch_size, True, NEVER_FULL)
        _ims, ims_x, _iops = measure(name, args.steps, args.batch_size, True, NEVER_FULL, idle_s=IDLE_S)
        print(f"{name:<12} {ops:>8} | {ms:>6.1f} {ms_x:>6.1f} {ms / ops * 1e3:>5.1f} {ms_x / ops * 1e3:>5.1f} |"
              f" {rms:>6.2f} {rms_x:>6.2f} {rms / ops * 1e3:>5.1f} {rms_x / ops * 1e3:>5.1f} |"
              f" {nms_x:>5.2f} {nms_x / ops * 1e3:>6.1f} | {ims_x:>6.2f} | {rops:>5} {ms_x / rms_x:>6.1f}x"
              f" {python_calls_per_step(name, args.batch_size):>6}")
    print("excl = without CPU inside EmulatedGPU.host_wait (sync spinning). Targets apply to excl:"
          " <= 25 us/op per op, <= 2 ms/step with replay")
    print("calls = Python-level calls (cProfile's count) of one replayed step: independent of the host's speed and load")
    print(f"host: Python runs {post_sleep_slowdown():.2f}x slower right after a 5 ms sleep than back to back"
          " (the default-queue replay steps sleep on a full launch queue; 'never full' does not; 'idle' is"
          f" 'never full' with the host asleep {IDLE_S * 1e3:.0f} ms before each step: the same emulator work after"
          " an idle host)")
    print(f"floor: a __torch_dispatch__ subclass doing no work costs {dispatch_floor_us():.1f} us of host CPU per"
          " dispatched op here (torch's own dispatch and autograd)")
    if args.phases:
        print(f"\n{'min ms per part (excl)':<22} " + " ".join(f"{p:>9}" for p in PHASES))
        for label, values in parts.items():
            print(f"{label:<22} " + " ".join(f"{v:>9.2f}" for v in values))


if __name__ == "__main__":
    main()
