"""Host<->device copies: pinned non_blocking copies are queued, pageable copies block the host for nbytes/bw."""

from __future__ import annotations

import time

import pytest
import torch

import gpemu.torch_backend as gt


def test_pinned_non_blocking_is_queued_on_the_copy_engine(emu: gt.Emulation) -> None:
    spec = emu.devices[0].spec
    src = torch.zeros(64, 1024, 1024, dtype=torch.uint8).pin_memory()  # 64 MiB = 67108864 bytes
    assert src.is_pinned()
    x = src.cuda(non_blocking=True)
    returned_s = time.perf_counter()
    copy_s = 67108864 / (spec.h2d_pinned_gbps * 1e9)
    assert x.is_cuda
    # The host got control back before the copy engine finished the copy: it did not wait for it.
    assert returned_s < emu.devices[0].engines["h2d"].t_free
    assert emu.devices[0].engines["h2d"].busy_s == pytest.approx(copy_s, rel=1e-9)
    assert emu.devices[0].stats.h2d_bytes == 67108864


def test_host_factories_with_pin_memory_make_pinned_tensors(emu: gt.Emulation) -> None:
    # pytorch/tutorials pinmem_nonblock.py: torch.randn(1_000_000, pin_memory=True) asked the absent driver for the
    # buffer and died ("Found no NVIDIA driver on your system").
    spec = emu.devices[0].spec
    src = torch.randn(1024, 1024, pin_memory=True)  # 4 MiB of fp32 = 4194304 bytes
    empty = torch.empty(8, 16, dtype=torch.uint8, pin_memory=True)
    assert not src.is_cuda and src.shape == (1024, 1024) and src.is_pinned() and empty.is_pinned()
    assert not torch.randn(4).is_pinned()
    x = src.to("cuda:0", non_blocking=True)  # queued on the copy engine at the pinned bandwidth
    assert x.is_cuda
    assert emu.devices[0].engines["h2d"].busy_s == pytest.approx(4194304 / (spec.h2d_pinned_gbps * 1e9), rel=1e-9)


def test_pageable_copy_blocks_the_host(emu: gt.Emulation) -> None:
    spec = emu.devices[0].spec
    src = torch.zeros(16, 1024, 1024, dtype=torch.uint8)  # 16 MiB pageable = 16777216 bytes
    copy_s = 16777216 / (spec.h2d_pageable_gbps * 1e9)
    t0 = time.perf_counter()
    src.to("cuda", non_blocking=True)  # non_blocking from pageable memory still blocks, as CUDA does
    assert time.perf_counter() - t0 >= copy_s * 0.99


def test_event_elapsed_time_measures_the_stream(emu: gt.Emulation) -> None:
    stream = emu.devices[0].default_stream
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    stream.enqueue(0.020, "fake kernel")  # 20 ms of GPU work
    end.record()
    launch_ms = emu.devices[0].spec.launch_overhead_us / 1e3  # the kernel starts one launch latency after `start`
    assert 20.0 <= start.elapsed_time(end) <= 20.0 + launch_ms + 0.5


def test_streams_and_device_api(emu: gt.Emulation) -> None:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
        torch.zeros(10, device="cuda")
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    props = torch.cuda.get_device_properties(0)
    assert props.total_memory == emu.devices[0].memory_limit_bytes
    assert torch.cuda.get_device_capability() == emu.devices[0].spec.compute_capability
    assert torch.accelerator.current_accelerator().type == "cuda"
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info()[1] == emu.devices[0].memory_limit_bytes


def test_autocast_halves_activation_memory(emu: gt.Emulation) -> None:
    w = torch.randn(1024, 1024, device="cuda")
    x = torch.randn(4096, 1024, device="cuda")
    with torch.autocast("cuda"):
        y = x @ w
    assert y.dtype == torch.float16
    assert (x @ w).dtype == torch.float32


def test_memory_limit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPEMU_GPU", "t4")
    monkeypatch.setenv("GPEMU_MEMORY_LIMIT", "1GiB")
    emu = gt.install_from_env()
    try:
        assert torch.cuda.get_device_properties(0).total_memory == 1024**3
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")  # 2 GiB > 1 GiB limit
        assert emu.gpu_key == "t4"
    finally:
        gt.uninstall()


@pytest.mark.parametrize(("gpu", "threads"), [("v100", 2048), ("t4", 1024), ("a10", 1536), ("a100", 2048)])
def test_resident_threads_per_sm_follow_the_compute_capability(gpu: str, threads: int) -> None:
    # CUDA C++ Programming Guide, max resident threads per SM: 7.0 / 8.0 2048, 7.5 (Turing) 1024, 8.6 (GA10x) 1536
    gt.install(gpu)
    try:
        assert torch.cuda.get_device_properties(0).max_threads_per_multi_processor == threads
    finally:
        gt.uninstall()


def test_host_to_device_copies_keep_the_memory_format(emu: gt.Emulation) -> None:
    # pytorch/tutorials memory_format_tutorial.py: "``to``, ``cuda``, ``float`` ... preserves memory format"
    x = torch.empty(10, 3, 32, 32, memory_format=torch.channels_last)
    assert x.cuda().stride() == (3072, 1, 96, 3)  # was (3072, 1024, 32, 1)
    assert x.to("cuda").is_contiguous(memory_format=torch.channels_last)
    assert x.to("cuda", dtype=torch.float16).stride() == (3072, 1, 96, 3)
    view = torch.empty(4, 8)[:, ::2]  # not dense: copied contiguous, as torch does
    assert view.cuda().stride() == (4, 1)


def test_d2h_into_a_host_buffer_writes_zeros_once(emu: gt.Emulation) -> None:
    # Note [D2H into a host buffer]: 64 MiB of a computed tensor into a preallocated pinned buffer: zeros, as a
    # .cpu() read gives, at the D2H bandwidth on the copy engine; a second copy does not rewrite the zeros, and a
    # buffer the host wrote in between is zeroed again.
    spec = emu.devices[0].spec
    dev = torch.randn(32, 1024, 1024, dtype=torch.float16, device="cuda")  # computed on the device: no host value
    host = torch.full((32, 1024, 1024), 7.0, dtype=torch.float16).pin_memory()
    busy0 = emu.devices[0].busy_s("d2h")
    host.copy_(dev, non_blocking=True)
    assert float(host.abs().max()) == 0.0
    version = host._version
    host.copy_(dev, non_blocking=True)
    assert host._version == version + 1 and float(host.abs().max()) == 0.0
    host[0, 0, 0] = 5
    host.copy_(dev)
    assert float(host.abs().max()) == 0.0
    assert emu.devices[0].stats.d2h_bytes >= 3 * 67108864
    # each copy is priced at 67108864 / d2h_pinned_gbps (1.3 ms at 50 GB/s), not at the host's memset speed
    assert emu.devices[0].busy_s("d2h") - busy0 >= 3 * 67108864 / (spec.d2h_pinned_gbps * 1e9) * 0.99
