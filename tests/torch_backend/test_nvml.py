"""pynvml calls answered from the emulated devices (Note [Emulated NVML] in gpemu/torch_backend/nvml.py)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator

import pytest
import torch

import gpemu.torch_backend as gt


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def _fake_pynvml() -> types.ModuleType:
    """A stand-in for nvidia-ml-py's `pynvml` on a host without a driver: every call fails as the real one does."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _NVMLError  # type: ignore[attr-defined]
    mod.NVML_ERROR_INVALID_ARGUMENT = 2  # type: ignore[attr-defined]
    mod.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    mod.NVML_ERROR_LIBRARY_NOT_FOUND = 12  # type: ignore[attr-defined]

    def missing(*args: object, **kwargs: object) -> None:
        raise _NVMLError(12)  # NVMLError_LibraryNotFound: no libnvidia-ml.so.1

    for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
                 "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetPowerUsage"):
        setattr(mod, name, missing)
    mod.nvmlErrorString = lambda code: f"code {code}"  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def fake_pynvml() -> Iterator[types.ModuleType]:
    saved = sys.modules.get("pynvml")
    mod = sys.modules["pynvml"] = _fake_pynvml()
    yield mod
    if saved is None:
        del sys.modules["pynvml"]
    else:
        sys.modules["pynvml"] = saved


def test_pynvml_answers_from_the_emulated_gpus(fake_pynvml: types.ModuleType) -> None:
    original_init = fake_pynvml.nvmlInit
    gt.install("a100", count=2)
    try:
        # NVIDIA DeepLearningExamples' gpu_affinity.set_affinity: nvmlInit, then nvmlDeviceGetCount (it died in
        # nvmlInit with NVMLError_LibraryNotFound before)
        fake_pynvml.nvmlInit()
        assert fake_pynvml.nvmlDeviceGetCount() == 2
        handle = fake_pynvml.nvmlDeviceGetHandleByIndex(1)
        assert fake_pynvml.nvmlDeviceGetName(handle) == torch.cuda.get_device_name(1)
        # used = total - free, the figures torch.cuda.mem_get_info reports: a 64 MiB tensor raises `used` by the
        # 64 MiB block the caching allocator reserves for it
        before = fake_pynvml.nvmlDeviceGetMemoryInfo(handle)
        x = torch.empty(16 * 1024**2, device="cuda:1")  # 16 Mi floats = 64 MiB
        after = fake_pynvml.nvmlDeviceGetMemoryInfo(handle)
        free, total = torch.cuda.mem_get_info(1)
        assert (after.total, after.free, after.used) == (total, free, total - free)
        assert after.used - before.used == 64 * 1024**2
        del x
        # one 64-bit mask with a bit per host CPU (cpu_count <= 64 here: 2 CPUs -> 0b11)
        masks = fake_pynvml.nvmlDeviceGetCpuAffinity(handle, 1)
        assert masks == [(1 << min(os.cpu_count() or 1, 64)) - 1]
        with pytest.raises(_NVMLError) as invalid:
            fake_pynvml.nvmlDeviceGetHandleByIndex(2)
        assert invalid.value.value == 2  # NVML_ERROR_INVALID_ARGUMENT
        with pytest.raises(_NVMLError) as unsupported:
            fake_pynvml.nvmlDeviceGetPowerUsage(handle)
        assert unsupported.value.value == 3  # NVML_ERROR_NOT_SUPPORTED: nothing in the model stands behind power
        assert fake_pynvml.nvmlErrorString(3) == "code 3"  # pynvml's own helpers stay
    finally:
        gt.uninstall()
    assert fake_pynvml.nvmlInit is original_init  # uninstall puts the library's functions back
