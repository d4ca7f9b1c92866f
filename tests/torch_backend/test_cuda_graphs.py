"""CUDA graphs in the drop-in: capture records, replay launches once, syncs in capture raise (Note [CUDA graphs])."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import gpemu.torch_backend as gt
from gpemu.device.graph import GraphCaptureError


def _sleep_s(emu: gt.Emulation, seconds: float) -> int:
    """Return the torch.cuda._sleep cycles that last `seconds` on the emulated GPU (cycles / boost clock)."""
    return round(seconds * emu.devices[0].spec.boost_clock_mhz * 1e6)


def test_replay_runs_the_captured_work_after_one_launch_and_does_not_block_the_host(emu: gt.Emulation) -> None:
    dev = emu.devices[0]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            torch.cuda._sleep(_sleep_s(emu, 0.020))  # three 20 ms kernels: the graph holds 60 ms of GPU work
    assert dev.busy_s() == 0.0  # capturing ran nothing
    capture = g._capture
    assert capture is not None and capture.kernels == 3
    assert capture.work_s == pytest.approx(0.060, rel=1e-6)
    t0 = time.perf_counter()
    start_s = dev.clock.now()
    for _ in range(4):
        g.replay()
    issued_s = time.perf_counter() - t0
    # 4 launches of 60 ms: the GPU is busy until start + 4 x 60 ms + one launch latency, the host is back at once
    assert dev.default_stream.t_done == pytest.approx(start_s + 0.240 + dev.spec.launch_overhead_us * 1e-6, abs=2e-3)
    assert issued_s < 0.060
    torch.cuda.synchronize()
    assert dev.busy_s() == pytest.approx(0.240, rel=1e-6)
    assert time.perf_counter() - t0 >= 0.239


def test_graphed_module_costs_what_the_eager_one_does_on_the_gpu(emu: gt.Emulation) -> None:
    dev = emu.devices[0]
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).cuda()
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        model(x)
        torch.cuda.synchronize()
        busy0 = dev.busy_s()
        model(x)  # eager: 8 addmm kernels
        torch.cuda.synchronize()
        eager_s = dev.busy_s() - busy0
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(x)
        busy0 = dev.busy_s()
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    assert g._capture is not None and g._capture.kernels == 8
    assert (dev.busy_s() - busy0) / 10 == pytest.approx(eager_s, rel=1e-6)  # same ops, same prices
    assert static_y.shape == (64, 512) and static_y.is_cuda


def test_host_syncs_inside_a_capture_raise_like_cuda_and_the_capture_ends(emu: gt.Emulation) -> None:
    x = torch.ones(8, device="cuda")
    for read in (lambda: x.sum().item(), lambda: x.cpu(), torch.cuda.synchronize, lambda: x.tolist()):
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"), torch.cuda.graph(g):
            read()
        assert not torch.cuda.is_current_stream_capturing()
    assert issubclass(GraphCaptureError, RuntimeError)
    assert x.sum().item() == 8.0  # eager reads work again once the capture is over


def test_capture_on_the_default_stream_is_refused(emu: gt.Emulation) -> None:
    g = torch.cuda.CUDAGraph()
    with pytest.raises(GraphCaptureError, match="non-default stream"):
        g.capture_begin()
    with pytest.raises(GraphCaptureError, match="without a preceding successful capture"):
        g.replay()


def test_is_current_stream_capturing_inside_and_outside(emu: gt.Emulation) -> None:
    g = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.graph(g):
        seen.append(torch.cuda.is_current_stream_capturing())
        seen.append(torch.cuda.current_stream().is_capturing())
    assert seen == [True, True] and not torch.cuda.is_current_stream_capturing()


def test_forked_branches_replay_concurrently(emu: gt.Emulation) -> None:
    """A capture that forks a side stream (event record + wait) and joins it: a 20 ms kernel on the capture stream
    and a pinned host-to-device copy on the side stream overlap on replay (compute and copy engines)."""
    dev = emu.devices[0]
    host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()  # 64 MiB
    copy_s = host.numel() / (dev.spec.h2d_pinned_gbps * 1e9)  # ~5 ms at 12 GB/s: the engine's figure
    side = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        side.wait_stream(torch.cuda.current_stream())  # fork
        with torch.cuda.stream(side):
            dst = host.to("cuda", non_blocking=True)
        torch.cuda._sleep(_sleep_s(emu, 0.020))
        torch.cuda.current_stream().wait_stream(side)  # join
    assert not side.is_capturing()
    start_s = dev.clock.now()
    g.replay()
    span_s = dev.default_stream.t_done - start_s
    # overlapped: max(20 ms, copy) + launch latency, not their sum
    assert span_s == pytest.approx(max(0.020, copy_s) + dev.spec.launch_overhead_us * 1e-6, abs=1e-3)
    assert span_s < 0.020 + copy_s - 0.5 * min(0.020, copy_s)
    torch.cuda.synchronize()
    assert dev.engines["h2d"].busy_s == pytest.approx(copy_s, rel=1e-6)
    assert dst.shape == host.shape


def test_memory_freed_inside_a_capture_stays_in_the_graphs_pool(emu: gt.Emulation) -> None:
    """Blocks freed during capture stay reserved for the graph's private pool: eager code after the capture cannot
    reuse them (torch's graph pools), so the same 64 MiB request needs a new segment."""
    mib64 = 64 * 2**20
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = torch.empty(mib64, dtype=torch.uint8, device="cuda")
        del tmp  # freed into the graph's pool
    allocated0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    eager = torch.empty(mib64, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() == allocated0 + mib64
    assert torch.cuda.memory_reserved() == reserved0 + mib64  # a new 64 MiB segment, not the pool's block
    del eager
    # without a capture in between, the freed eager block is reused: reserved does not grow
    reserved1 = torch.cuda.memory_reserved()
    again = torch.empty(mib64, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == reserved1
    del again
    # torch.cuda.graph's entry empties the cache: the eager segment goes, the live graph's pool stays, and a second
    # graph given that pool reuses its free block: 128 - 64 MiB reserved
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g.pool()):
        tmp2 = torch.empty(mib64, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_reserved() == reserved1 - mib64
    del tmp2
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == reserved1 - mib64  # both graphs still hold the pool
    g.reset()
    del g2
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == reserved1 - 2 * mib64  # no graph holds it: released


def test_make_graphed_callables_trains_and_replays(emu: gt.Emulation) -> None:
    dev = emu.devices[0]
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    graphed = torch.cuda.make_graphed_callables(model, (torch.randn(32, 256, device="cuda"),))
    allocated = []
    for _ in range(4):
        loss = graphed(torch.randn(32, 256, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    assert len(set(allocated[1:])) == 1  # replays allocate nothing that stays
    assert dev.stats.work_count["kernel"] > 0


def test_accelerator_graph_context_and_debug_dump(emu: gt.Emulation, tmp_path: Path) -> None:
    x = torch.zeros(2000, device="cuda")
    stream = torch.Stream()
    graph = torch.accelerator.Graph()
    with stream, graph:
        x += 1
        x *= 2
    graph.replay()
    graph.debug_dump(str(tmp_path / "g.json"))
    dump = json.loads((tmp_path / "g.json").read_text())
    assert dump["kernels"] == 2 and sum(n["kernels"] for n in dump["nodes"]) == 2


def test_graph_types_stay_classes_for_annotations(emu: gt.Emulation) -> None:
    # Libraries name the classes at import time (transformers: `-> torch.cuda.CUDAGraph | None`)
    assert (torch.cuda.CUDAGraph | None) is not None and not isinstance(object(), torch.cuda.CUDAGraph)
    assert issubclass(type("Capture", (torch.cuda.graph,), {}), torch.cuda.graph)


def test_a_captured_zoo_model_keeps_its_kernel_prices_not_the_host_bound_phase_target(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Phases and CUDA graphs]: a recognised model's eager forward is charged its phase target, which holds the
    host's dispatch between kernels (resnet18 at batch 1 on an H100 is host-bound); captured, its kernels keep their
    per-op predictions, the sum a GPEMU_PHASE_PREDICT=0 run charges, and eager steps after the replays are charged
    the target again."""
    import torchvision

    emu = gt.install("h100")
    try:
        dev = emu.devices[0]
        model = torchvision.models.resnet18().cuda().eval()
        x = torch.randn(1, 3, 224, 224, device="cuda")

        def eager_busy() -> float:
            with torch.no_grad():
                for _ in range(3):  # the first pass calibrates the phase scale
                    model(x)
                torch.cuda.synchronize()
                busy0 = dev.busy_s()
                model(x)
                torch.cuda.synchronize()
            return dev.busy_s() - busy0

        monkeypatch.setenv("GPEMU_PHASE_PREDICT", "0")
        per_op_s = eager_busy()
        monkeypatch.delenv("GPEMU_PHASE_PREDICT")
        emu.phases._targets.clear()
        target_s = eager_busy()
        assert target_s > 2 * per_op_s  # host-bound: the target holds ~68 dispatches of the time model's host
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            model(x)
        busy0 = dev.busy_s()
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        assert (dev.busy_s() - busy0) / 5 == pytest.approx(per_op_s, rel=1e-6)
        assert eager_busy() == pytest.approx(target_s, rel=1e-6)
    finally:
        gt.uninstall()


def test_replayed_graph_work_is_labelled_in_the_trace_args(emu: gt.Emulation) -> None:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.cuda._sleep(1000)
        torch.cuda._sleep(1000)
    capture = g._capture
    assert capture is not None
    works = capture.replay(emu.devices[0].default_stream)
    assert [w.args["timing"] for w in works] == ["cuda-graph"] and works[0].args["kernels"] == 2
    assert works[0].args["first"] == "cuda_sleep" and works[0].name == f"cuda graph {capture.graph_id}"

