"""Older torch releases: version-dependent internals are guarded, and a failed install leaves nothing behind (Note
[Older torch releases] in gpemu/torch_backend/emulation.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.profiler.profiler as profiler_mod
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

import gpemu.torch_backend as gt
from gpemu.torch_backend import optim_replay, phases, profiling, tensor
from gpemu.torch_backend.patches import Patcher

REPO = Path(__file__).resolve().parents[2]
_MISSING = object()


def _boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("simulated patch failure")


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str, Any]]:
    """Return (object, name, original) for every attribute a Patcher sets while the test runs."""
    seen: list[tuple[Any, str, Any]] = []
    real_set = Patcher.set

    def spy(self: Patcher, obj: Any, name: str, value: Any) -> None:
        seen.append((obj, name, vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING))
        real_set(self, obj, name, value)

    monkeypatch.setattr(Patcher, "set", spy)
    return seen


@pytest.fixture
def no_leftover() -> Iterator[None]:
    """Uninstall whatever a test left installed."""
    yield
    gt.uninstall()


@pytest.mark.parametrize(("description", "owner", "name"), [
    ("a patch late in install() raises", optim_replay, "apply"),
    ("install() fails after the phase hooks and device listeners are in place", phases.PhaseTracker, "warm"),
])
def test_a_failed_install_undoes_every_patch(monkeypatch: pytest.MonkeyPatch, recorded: list[tuple[Any, str, Any]],
                                             no_leftover: None, description: str, owner: Any, name: str) -> None:
    to, is_available, meta_path = torch.Tensor.to, torch.cuda.is_available, list(sys.meta_path)
    module_hooks = len(torch.nn.modules.module._global_forward_pre_hooks)
    monkeypatch.setattr(owner, name, _boom)
    with pytest.raises(RuntimeError, match="simulated patch failure"):
        gt.install("h100")
    assert len(recorded) > 100, description  # torch.cuda.*, Tensor methods, factories, ... were patched first
    first: dict[tuple[int, str], tuple[Any, str, Any]] = {}  # an attribute patched twice: its first original
    for obj, attr, original in recorded:
        first.setdefault((id(obj), attr), (obj, attr, original))
    left = [f"{getattr(obj, '__name__', obj)}.{attr}" for obj, attr, original in first.values()
            if (vars(obj).get(attr, _MISSING) if hasattr(obj, "__dict__") else _MISSING) is not original]
    assert left == [], description
    assert gt.current_emulation() is None
    assert torch.Tensor.to is to and torch.cuda.is_available is is_available
    assert sys.meta_path == meta_path  # import hooks (hf_generate, flex_attention, ...) removed
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == module_hooks
    assert type(torch.zeros(2)) is torch.Tensor
    monkeypatch.undo()
    emu = gt.install("h100")  # and a later install works
    assert torch.cuda.is_available() and emu.devices[0].spec.key.startswith("h100")


def test_gpemu_run_says_without_emulation_and_means_it(tmp_path: Path) -> None:
    # sitecustomize, as `gpemu run` starts it, with a patch that fails (as the profiler's did with torch 2.11)
    script = tmp_path / "boot.py"
    script.write_text(
        "import os, runpy, sys\n"
        "import torch\n"
        "import gpemu.torch_backend.optim_replay as optim_replay\n"
        "def boom(patcher):\n"
        "    raise RuntimeError('simulated patch failure')\n"
        "optim_replay.apply = boom\n"
        "to, available = torch.Tensor.to, torch.cuda.is_available\n"
        "os.environ['GPEMU_GPU'] = 'h100'\n"
        "runpy.run_path(sys.argv[1], run_name='sitecustomize')\n"
        "print('restored', torch.Tensor.to is to, torch.cuda.is_available is available, type(torch.ones(2)).__name__)\n",
        encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("GPEMU_GPU", None)
    out = subprocess.run([sys.executable, str(script), str(REPO / "src/gpemu/_boot/sitecustomize.py")], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert "could not install the emulated GPU (RuntimeError: simulated patch failure)" in out.stderr
    assert "restored True True Tensor" in out.stdout


def test_an_optional_patch_that_fails_is_undone_and_the_rest_installs(
        monkeypatch: pytest.MonkeyPatch, no_leftover: None, capfd: pytest.CaptureFixture[str]) -> None:
    supported = profiler_mod.supported_activities

    def half_then_fail(patcher: Patcher) -> None:
        patcher.set(profiler_mod, "supported_activities", lambda: {ProfilerActivity.CPU})
        raise AttributeError("module 'torch.profiler.profiler' has no attribute '_renamed_in_a_later_release'")

    monkeypatch.setattr(profiling, "apply", half_then_fail)
    gt.install("h100")
    assert "torch.profiler's CUDA activity is not emulated with torch" in capfd.readouterr().err
    assert profiler_mod.supported_activities is supported  # the half that was applied is undone
    x = torch.randn(64, 64, device="cuda")
    assert torch.cuda.is_available() and isinstance(x @ x, gt.EmuTensor)


def test_patcher_optional_undoes_only_its_block(capfd: pytest.CaptureFixture[str]) -> None:
    ns = types.SimpleNamespace(a=1, b=2)
    patcher = Patcher()
    patcher.set(ns, "a", 10)
    with patcher.optional("the b feature"):
        patcher.set(ns, "b", 20)
        patcher.set(ns, "c", 30)
        raise KeyError("b")
    assert (ns.a, ns.b, hasattr(ns, "c")) == (10, 2, False)
    assert "the b feature is not emulated" in capfd.readouterr().err
    patcher.restore()
    assert ns.a == 1


def test_restore_undoes_everything_even_when_one_undo_fails() -> None:
    ns = types.SimpleNamespace(a=1, b=2)
    patcher = Patcher()
    patcher.set(ns, "a", 10)
    # an optional block whose own undo fails: the rest of it is undone, and the failure goes on to install(), which
    # then undoes everything (nothing is left half-installed)
    with pytest.raises(RuntimeError, match="simulated"), patcher.optional("the b feature"):
        patcher.set(ns, "b", 20)
        patcher.on_restore(_boom)
        raise KeyError("b")
    assert (ns.a, ns.b) == (10, 2)
    patcher.on_restore(_boom)
    with pytest.raises(RuntimeError, match="simulated"):
        patcher.restore()
    assert ns.a == 1


def test_pyobj_dispatcher_flag_matches_this_torch() -> None:
    # torch 2.14 added OpOverload._pyobj_dispatcher; 2.13 and 2.11 have none (Note [Older torch releases])
    assert hasattr(torch.ops.aten.view.default, "_pyobj_dispatcher") == tensor._HAS_PYOBJ_DISPATCHER


def test_views_without_pyobj_dispatcher(monkeypatch: pytest.MonkeyPatch, no_leftover: None) -> None:
    monkeypatch.setattr(tensor, "_HAS_PYOBJ_DISPATCHER", False)  # as on torch < 2.14: always OpOverload._op
    emu = gt.install("h100")
    x = torch.randn(8, 16, device="cuda")
    allocated = torch.cuda.memory_allocated()
    views = [x.view(16, 8), x[2:4], x.t(), x.unsqueeze(0), x.reshape(128)]
    assert [tuple(v.shape) for v in views] == [(16, 8), (2, 16), (16, 8), (1, 8, 16), (128,)]
    assert all(isinstance(v, gt.EmuTensor) and v.device.type == "cuda" for v in views)
    assert torch.cuda.memory_allocated() == allocated  # views take no memory
    assert emu.devices[0].stats is not None


def _simulate_torch_2_11(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch.profiler look like torch 2.11's: no _parse_activities, `set(activities)` in __init__."""
    orig_init = profiler_mod._KinetoProfile.__init__

    def init_2_11(self: Any, *, activities: Any = None, **kwargs: Any) -> None:
        orig_init(self, **kwargs)
        self.activities = set(activities) if activities else profiler_mod.supported_activities()
        self.use_device = "cuda" if ProfilerActivity.CUDA in self.activities else None

    monkeypatch.delattr(profiler_mod, "_parse_activities", raising=False)
    monkeypatch.setattr(profiler_mod._KinetoProfile, "__init__", init_2_11)


def test_profiler_without_parse_activities(monkeypatch: pytest.MonkeyPatch, no_leftover: None,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    _simulate_torch_2_11(monkeypatch)
    gt.install("h100")
    assert "is not emulated" not in capfd.readouterr().err  # the profiler patch found its older hook
    assert not hasattr(profiler_mod, "_parse_activities")
    a = torch.randn(512, 512, device="cuda")
    kineto = profiler_mod._KinetoProfile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    assert kineto.activities == {ProfilerActivity.CPU} and kineto.use_device == "cuda"
    kineto.start()
    (a @ a).sum()
    kineto.stop()
    kernels = [e for e in kineto.events() if e.device_type == DeviceType.CUDA]
    assert len(kernels) == 2  # mm, sum: the emulated kernels
    with torch.profiler.profile() as prof:  # torch's default activities
        a @ a
    assert sum(e.device_type == DeviceType.CUDA for e in prof.events()) == 1


def test_profiling_patch_uses_parse_activities_when_present(no_leftover: None) -> None:
    if not hasattr(profiler_mod, "_parse_activities"):
        pytest.skip(f"torch {torch.__version__} has no torch.profiler.profiler._parse_activities (before 2.12)")
    gt.install("h100")
    parsed, filters = profiler_mod._parse_activities([ProfilerActivity.CPU, {ProfilerActivity.CUDA: []}])
    assert parsed == {ProfilerActivity.CPU} and filters == {}


def test_nvtx_ranges_on_a_cpu_only_build(monkeypatch: pytest.MonkeyPatch, no_leftover: None) -> None:
    import torch.cuda.nvtx as nvtx_mod

    class Stub:  # what torch.cuda.nvtx has on a `+cpu` build (Note [NVTX without a CUDA build])
        @staticmethod
        def rangePushA(msg: str) -> int:
            raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")

    stub = Stub()
    monkeypatch.delattr(torch._C, "_nvtx", raising=False)
    monkeypatch.setattr(nvtx_mod, "_nvtx", stub)
    gt.install("h100")
    assert [torch.cuda.nvtx.range_push("step"), torch.cuda.nvtx.range_push("fwd")] == [0, 1]  # zero-based depths
    assert [torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop()] == [1, 0, -1]
    with torch.cuda.nvtx.range("fwd"):
        torch.zeros(4, device="cuda")
    torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("data"))
    torch.cuda.nvtx.mark("loaded")
    gt.uninstall()
    assert nvtx_mod._nvtx is stub
