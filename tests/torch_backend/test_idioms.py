"""Idioms of public training scripts on the emulated device: default device, cuda generators, torch.load, flags."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.serialization as ser
from torch import nn

import gpemu.torch_backend as gt
from gpemu.errors import GpemuError
from gpemu.torch_backend import EmuTensor


@pytest.fixture
def emu2() -> Iterator[gt.Emulation]:
    """Return an installed 2x A100 emulation; uninstall afterwards."""
    e = gt.install("a100", count=2)
    yield e
    gt.uninstall()


@pytest.fixture
def cuda_default(emu: gt.Emulation) -> Iterator[gt.Emulation]:
    """Return the V100 emulation with torch.set_default_device("cuda") in force; reset afterwards."""
    torch.set_default_device("cuda")
    try:
        yield emu
    finally:
        torch.set_default_device(None)


def _allocated(emu: gt.Emulation, index: int = 0) -> int:
    return emu.devices[index].allocator.memory_allocated()


# ---- 1. default device -----------------------------------------------------------------------------------------


def test_set_default_device_puts_factories_and_parameters_on_the_emulated_gpu(cuda_default: gt.Emulation) -> None:
    before = _allocated(cuda_default)
    model = nn.Linear(64, 32)
    x = torch.randn(8, 64)
    assert isinstance(model.weight, EmuTensor) and isinstance(x, EmuTensor)
    assert model.weight.device == torch.device("cuda", 0) and isinstance(model.weight, nn.Parameter)
    # weight 32*64*4 = 8192 B, bias 32*4 = 128 -> 512 B (512 B rounding), x 8*64*4 = 2048 B: 8192 + 512 + 2048
    assert _allocated(cuda_default) - before == 10752
    model(x).sum().backward()
    assert model.weight.grad is not None and model.weight.grad.is_cuda
    assert torch.get_default_device() == torch.device("cuda", 0)
    assert torch.zeros(2, device="cpu").device.type == "cpu"  # an explicit device still wins


def test_with_torch_device_scopes_the_default(emu: gt.Emulation) -> None:
    with torch.device("cuda"):
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
        buf = torch.arange(10)
        assert torch.get_default_device() == torch.device("cuda", 0)
    assert all(isinstance(p, EmuTensor) for p in model.parameters())
    assert isinstance(buf, EmuTensor) and buf.dtype == torch.int64
    assert type(torch.zeros(2)) is torch.Tensor and torch.get_default_device() == torch.device("cpu")


def test_meta_device_context_keeps_working_under_emulation(emu: gt.Emulation) -> None:
    with torch.device("meta"):  # HF-style empty-weight init
        model = nn.Linear(4, 4)
    assert model.weight.device.type == "meta" and not isinstance(model.weight, EmuTensor)


# ---- 2. generators -----------------------------------------------------------------------------------------------


def test_cuda_generator_seeds_and_round_trips_its_state(emu: gt.Emulation) -> None:
    g = torch.Generator(device="cuda")
    assert isinstance(g, torch.Generator) and isinstance(torch.Generator(), torch.Generator)
    assert g.device == torch.device("cuda", 0) and torch.Generator().device.type == "cpu"
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    saved = g.get_state()
    first = torch.randperm(50, generator=g, device="cuda").tolist()
    g.set_state(saved)
    assert torch.randperm(50, generator=g, device="cuda").tolist() == first  # same state, same permutation
    assert sorted(first) == list(range(50))  # the host reads the real permutation, not zeros


@pytest.mark.parametrize(
    "draw",
    [
        lambda g: torch.randn(4, 5, generator=g, device="cuda"),
        lambda g: torch.rand(4, 5, generator=g, device="cuda"),
        lambda g: torch.randint(0, 9, (4, 5), generator=g, device="cuda"),
        lambda g: torch.empty(4, 5, device="cuda").normal_(generator=g),
        lambda g: torch.empty(4, 5, device="cuda").uniform_(-1, 1, generator=g),
        lambda g: torch.empty(4, 5, device="cuda").bernoulli_(0.5, generator=g),
    ],
)
def test_cuda_generator_is_accepted_by_random_ops(emu: gt.Emulation, draw) -> None:
    out = draw(torch.Generator(device="cuda"))
    assert isinstance(out, EmuTensor) and tuple(out.shape) == (4, 5)


def test_cuda_default_generators_follow_manual_seed(emu2: gt.Emulation) -> None:
    gens = torch.cuda.default_generators
    assert len(gens) == 2 and gens[1].device == torch.device("cuda", 1)
    torch.manual_seed(123)  # torch.manual_seed seeds every CUDA device too
    assert [g.initial_seed() for g in gens] == [123, 123]
    torch.cuda.manual_seed(5)  # the current device only
    assert [g.initial_seed() for g in gens] == [5, 123]
    states = torch.cuda.get_rng_state_all()
    torch.cuda.manual_seed_all(9)
    torch.cuda.set_rng_state_all(states)
    assert [torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), states, strict=True)] == [True, True]


def test_fork_rng_restores_the_cuda_state(emu: gt.Emulation) -> None:
    torch.cuda.manual_seed(1)
    before = torch.cuda.get_rng_state()
    with torch.random.fork_rng(devices=[0]):
        torch.cuda.manual_seed(99)
        assert torch.cuda.initial_seed() == 99
    assert torch.equal(torch.cuda.get_rng_state(), before) and torch.cuda.initial_seed() == 1


def test_dataloader_shuffles_with_a_cuda_generator(cuda_default: gt.Emulation) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10, device="cpu"))

    def order(seed: int) -> list[int]:
        g = torch.Generator(device="cuda")
        g.manual_seed(seed)
        loader = torch.utils.data.DataLoader(data, batch_size=5, shuffle=True, generator=g)
        return [int(i) for (batch,) in loader for i in batch]

    first = order(0)
    assert sorted(first) == list(range(10))  # every sample once (not index 0 ten times)
    assert order(0) == first and first != list(range(10))  # seeded, and shuffled


# ---- 3. torch.load -----------------------------------------------------------------------------------------------


def _checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ck.pt"
    torch.save({"w": torch.ones(64, 64), "b": torch.ones(64), "step": 3}, path)
    return path


@pytest.mark.parametrize(
    "map_location",
    ["cuda", "cuda:0", torch.device("cuda"), {"cpu": "cuda:0"}, lambda storage, loc: storage.cuda(0)],
    ids=["str", "str-index", "device", "dict", "callable"],
)
def test_load_with_map_location_cuda(emu: gt.Emulation, tmp_path: Path, map_location) -> None:
    path = _checkpoint(tmp_path)
    before, h2d = _allocated(emu), emu.devices[0].stats.h2d_bytes
    ck = torch.load(path, map_location=map_location)
    assert isinstance(ck["w"], EmuTensor) and ck["w"].device == torch.device("cuda", 0) and ck["step"] == 3
    assert tuple(ck["w"].shape) == (64, 64) and tuple(ck["b"].shape) == (64,)
    # w: 64*64*4 = 16384 B; b: 64*4 = 256 B -> 512 B allocated (512 B rounding)
    assert _allocated(emu) - before == 16384 + 512
    assert emu.devices[0].stats.h2d_bytes - h2d == 16384 + 256


def test_load_keeps_shared_storages_shared(emu: gt.Emulation, tmp_path: Path) -> None:
    base = torch.ones(32, 32)  # 32*32*4 = 4096 B
    torch.save({"a": base, "row": base[3], "t": base.t()}, tmp_path / "s.pt")
    before = _allocated(emu)
    ck = torch.load(tmp_path / "s.pt", map_location="cuda")
    assert _allocated(emu) - before == 4096  # one storage, one allocation
    assert ck["row"].storage_offset() == 96 and ck["t"].stride() == (1, 32)  # row 3 starts at 3*32


def test_plain_load_of_a_checkpoint_written_on_a_gpu(
    emu: gt.Emulation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # storages tagged "cuda:0", as torch.save writes them on a real GPU
        m.setattr(ser, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.ones(16, 16)}, tmp_path / "gpu.pt")
    ck = torch.load(tmp_path / "gpu.pt")  # weights_only=True, no map_location
    assert isinstance(ck["w"], EmuTensor) and ck["w"].device == torch.device("cuda", 0)
    cpu = torch.load(tmp_path / "gpu.pt", map_location="cpu")["w"]
    assert type(cpu) is torch.Tensor and torch.equal(cpu, torch.ones(16, 16))  # real values on the host


def test_load_of_a_device_beyond_the_emulated_count(
    emu: gt.Emulation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(ser, "location_tag", lambda storage: "cuda:1")
        torch.save({"w": torch.ones(4)}, tmp_path / "gpu1.pt")
    with pytest.raises(GpemuError, match="map_location"):
        torch.load(tmp_path / "gpu1.pt")
    ck = torch.load(tmp_path / "gpu1.pt", map_location={"cuda:1": "cuda:0"})
    assert ck["w"].device == torch.device("cuda", 0)


def test_load_state_dict_and_parameters(emu: gt.Emulation, tmp_path: Path) -> None:
    torch.save(nn.Linear(8, 4).state_dict(), tmp_path / "sd.pt")
    model = nn.Linear(8, 4).cuda()
    model.load_state_dict(torch.load(tmp_path / "sd.pt", map_location="cuda"))
    assert isinstance(model.weight, EmuTensor) and model.weight.requires_grad
    torch.save({"p": nn.Parameter(torch.ones(3))}, tmp_path / "p.pt")
    p = torch.load(tmp_path / "p.pt", map_location="cuda")["p"]
    assert isinstance(p, nn.Parameter) and p.is_cuda and p.requires_grad


# ---- 4. other idioms ---------------------------------------------------------------------------------------------


def test_backend_flags_nvtx_and_housekeeping(emu: gt.Emulation) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.set_float32_matmul_precision("high")
    torch.cuda.nvtx.range_push("step")
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("fwd"):
        torch.zeros(4, device="cuda")
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()
    torch.cuda.init()
    assert torch.cuda.is_initialized()
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    assert total_bytes == torch.cuda.get_device_properties(0).total_memory == emu.devices[0].memory_limit_bytes
    assert 0 < free_bytes < total_bytes  # the CUDA context is charged


def test_old_amp_spellings_and_grad_scaler(emu: gt.Emulation) -> None:
    model = nn.Linear(16, 16).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for scaler, ctx in ((torch.cuda.amp.GradScaler(), torch.cuda.amp.autocast),
                        (torch.amp.GradScaler("cuda"), lambda: torch.autocast("cuda"))):  # V100: fp16 only
        with ctx():
            y = model(torch.randn(4, 16, device="cuda"))
        assert y.dtype == torch.float16
        scaler.scale(y.float().sum()).backward()
        scaler.step(opt)
        scaler.update()


def test_utilization_reports_busy_share(emu: gt.Emulation) -> None:
    a = torch.empty(8192, 8192, device="cuda")
    a @ a  # the first call prices the op (host time); later ones hit the op cache
    torch.cuda.synchronize()
    torch.cuda.utilization()  # baseline sample
    a @ a  # 2 * 8192^3 = 1.1e12 flop: ~70 ms at a V100's 15.7 fp32 TFLOP/s, far more than the host needs to queue it
    assert torch.cuda.utilization() == 100
    torch.cuda.synchronize()
    torch.cuda.utilization()
    time.sleep(0.02)
    assert torch.cuda.utilization() == 0  # nothing queued in the last interval


def test_device_of_and_stream_context(emu2: gt.Emulation) -> None:
    t = torch.zeros(2, device="cuda:1")
    with torch.cuda.device_of(t):
        assert torch.cuda.current_device() == 1
    assert torch.cuda.current_device() == 0
    with torch.cuda.device_of(torch.zeros(2)):  # a CPU tensor leaves the device alone
        assert torch.cuda.current_device() == 0
    s = torch.cuda.Stream()
    with torch.cuda.StreamContext(s):
        assert torch.cuda.current_stream() == s
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


def test_channels_last_and_non_blocking_d2h(emu: gt.Emulation) -> None:
    x = torch.randn(2, 3, 8, 8).to("cuda", memory_format=torch.channels_last)
    assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
    model = nn.Conv2d(3, 4, 3).cuda().to(memory_format=torch.channels_last)
    assert model.weight.is_cuda and model.weight.is_contiguous(memory_format=torch.channels_last)
    out = model(x).to("cpu", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert out.device.type == "cpu" and tuple(out.shape) == (2, 4, 6, 6)


def test_set_per_process_memory_fraction(emu: gt.Emulation) -> None:
    torch.cuda.set_per_process_memory_fraction(0.5)
    with pytest.raises(ValueError, match="fraction"):
        torch.cuda.set_per_process_memory_fraction(1.5)


def test_small_host_values_survive_a_round_trip(emu: gt.Emulation, tmp_path: Path) -> None:
    assert torch.tensor([1.5, 2.5], device="cuda").tolist() == [1.5, 2.5]  # the host wrote these bytes itself
    assert torch.cuda.amp.GradScaler().get_scale() == 65536.0  # 2**16, GradScaler's default init_scale
    # small results of host-known inputs are computed (Note [Known values through small ops]); others are not
    assert (torch.ones(3, device="cuda") * 2).tolist() == [2.0, 2.0, 2.0]
    assert (torch.randn(3, device="cuda") * 2).tolist() == [0.0, 0.0, 0.0]
    assert (torch.ones(20_000, device="cuda") * 2)[:2].tolist() == [0.0, 0.0]  # 80 kB > KNOWN_VALUE_MAX_BYTES
    torch.cuda.manual_seed(11)
    torch.save({"cuda_rng": torch.cuda.get_rng_state()}, tmp_path / "rng.pt")
    expected = torch.randperm(20, device="cuda").tolist()
    rng = torch.load(tmp_path / "rng.pt", map_location="cuda")["cuda_rng"]
    assert rng.is_cuda
    torch.cuda.set_rng_state(rng.cpu())
    assert torch.randperm(20, device="cuda").tolist() == expected  # the restored state replays the same draw
    torch.cuda.set_rng_state(torch.zeros(16, dtype=torch.uint8))  # a real GPU's 16 B Philox state is accepted


# ---- legacy types and odds and ends ------------------------------------------------------------------------------


def test_legacy_cuda_tensor_types(emu: gt.Emulation) -> None:
    Tensor = torch.cuda.FloatTensor  # PyTorch-GAN style: Tensor(n, 1).fill_(1.0), imgs.type(Tensor)
    valid = Tensor(4, 1).fill_(1.0)
    assert isinstance(valid, EmuTensor) and tuple(valid.shape) == (4, 1) and isinstance(valid, torch.cuda.FloatTensor)
    assert not isinstance(valid, torch.cuda.LongTensor) and not isinstance(torch.zeros(2), torch.cuda.FloatTensor)
    imgs = torch.zeros(2, 3, dtype=torch.float64).type(Tensor)
    assert imgs.is_cuda and imgs.dtype == torch.float32 and imgs.type() == "torch.cuda.FloatTensor"
    assert torch.cuda.LongTensor([1, 2, 3]).tolist() == [1, 2, 3]
    assert imgs.type("torch.cuda.HalfTensor").dtype == torch.float16
    assert imgs.type(torch.FloatTensor).device.type == "cpu"  # back to the host
    torch.set_default_tensor_type(torch.cuda.FloatTensor)
    try:
        assert torch.empty(3).is_cuda
    finally:
        torch.set_default_tensor_type(torch.FloatTensor)
    assert not torch.empty(3).is_cuda


def test_new_tensor_stays_on_the_emulated_device(emu: gt.Emulation) -> None:
    x = torch.zeros(2, device="cuda", dtype=torch.float16)
    y = x.new_tensor([1, 2, 3])
    assert isinstance(y, EmuTensor) and y.dtype == torch.float16 and y.tolist() == [1.0, 2.0, 3.0]
    assert x.new_tensor([1], device="cpu").device.type == "cpu"


def test_cuda_random_module_and_nvml_queries(emu: gt.Emulation) -> None:
    import torch.cuda.random as cuda_random

    cuda_random.manual_seed_all(3)
    assert torch.cuda.default_generators[0].initial_seed() == 3 and len(cuda_random.get_rng_state_all()) == 1
    cuda_random.set_rng_state(torch.cuda.get_rng_state())
    assert torch.cuda.list_gpu_processes().startswith("GPU:0\nprocess")
    for name in ("temperature", "power_draw", "memory_usage"):
        with pytest.raises(GpemuError, match=f"torch.cuda.{name}"):
            getattr(torch.cuda, name)()
    assert torch.cuda.clock_rate() == 1380  # the V100 PCIe's boost clock (gpus.toml; no sustained clock below it)


def test_driver_queries_with_a_modelled_answer(emu: gt.Emulation) -> None:
    """Note [Driver queries with a modelled answer] in cuda_api.py."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(138_000_000)  # 100 ms ahead of the host: the events below are queued back to back behind it
    start.record()
    torch.cuda._sleep(1_380_000)  # 1.38e6 cycles at the V100's 1380 MHz boost clock = 1.000 ms
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx(1.0, abs=1e-6)
    free, total = torch.cuda.mem_get_info()
    assert torch.cuda.device_memory_used() == total - free > 0  # at least the 300 MiB CUDA context
    before = torch.cuda.memory_allocated()
    ptr = torch.cuda.caching_allocator_alloc(3 << 20)
    assert ptr != 0 and torch.cuda.memory_allocated() == before + (3 << 20)  # 3 MiB: a multiple of 512 B, kept
    torch.cuda.caching_allocator_delete(ptr)
    assert torch.cuda.memory_allocated() == before
    with pytest.raises(ValueError, match="caching_allocator_alloc"):
        torch.cuda.caching_allocator_delete(ptr)  # freed twice
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
    torch.cuda.set_per_process_memory_fraction(0.5)
    assert torch.cuda.memory.get_per_process_memory_fraction(0) == 0.5
    assert torch.cuda.Stream.priority_range() == (0, -5)
    with pytest.raises(GpemuError, match=r"torch\.cuda\.ExternalStream is not emulated"):
        torch.cuda.ExternalStream(0)


def test_device_generic_streams_events_and_accelerator_memory(emu: gt.Emulation) -> None:
    """Note [Device-generic streams and events] in accelerator_api.py: torch.Stream / torch.Event on the emulated
    accelerator, and torch.accelerator's memory queries."""
    a = torch.empty(4096, 4096, device="cuda")  # 64 MiB
    s = torch.Stream("cuda")
    assert isinstance(s, torch.Stream) and isinstance(torch.accelerator.current_stream(), torch.Stream)
    start, end = torch.Event(enable_timing=True), torch.Event("cuda", enable_timing=True)
    assert isinstance(start, torch.Event)
    with torch.cuda.stream(s):
        torch.cuda._sleep(138_000_000)  # keeps s busy 100 ms: the events are queued back to back behind it
        start.record(s)
        torch.cuda._sleep(690_000)  # 0.5 ms at 1380 MHz
        end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx(0.5, abs=1e-6)
    assert type(torch.Event("cpu")) is torch._C.Event  # any other device keeps torch's own class
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.cuda.memory_allocated() >= 64 << 20
    assert torch.accelerator.memory.memory_stats() == torch.cuda.memory_stats()
    assert torch.accelerator.get_memory_info() == torch.cuda.mem_get_info()
    assert torch.bfloat16 in torch.accelerator.get_device_capability()["supported_dtypes"]
    torch.accelerator.empty_host_cache()
    del a


def test_memory_stats_summary_and_snapshot(emu: gt.Emulation) -> None:
    torch.cuda.memory._record_memory_history(max_entries=1000)
    x = torch.empty(1024, 1024, device="cuda")  # 4 MiB = 4194304 B
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated() >= 4194304
    assert stats["allocation.large_pool.current"] == 1 and "num_alloc_retries" in stats  # torch's key names
    assert "PyTorch CUDA memory summary" in torch.cuda.memory_summary()
    sizes = [seg["total_size"] for seg in torch.cuda.memory_snapshot()]
    assert 4194304 in sizes
    del x


def test_sanity_checks_read_back_as_passing(emu: gt.Emulation) -> None:
    x = torch.randn(3, device="cuda")
    assert bool(torch.isfinite(x).all()) and not bool(torch.isnan(x).any())  # all() -> True, any() -> False
    dist = torch.distributions.Normal(x, torch.ones(3, device="cuda"))  # validate_args reads _is_all_true
    assert dist.sample().is_cuda and tuple(dist.sample((2,)).shape) == (2, 3)
    gt.set_value_hook(lambda shape, dtype, reason: 0)  # a value hook still answers first
    assert not bool(torch.isfinite(x).all())
    gt.set_value_hook(None)


def test_finite_checks_read_back_as_passing(emu: gt.Emulation) -> None:
    # Note [Finite checks read back as passing]: ultralytics' trainer runs `not self.loss.isfinite()` each epoch; the
    # computed loss read zeros (False: "not finite") and it warned "Loss NaN/Inf detected" on every emulated run
    w = torch.randn(4, device="cuda", requires_grad=True)
    loss = (w * 2).sum()
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with mode():
            assert bool(loss.isfinite()) and bool(torch.isfinite(loss)) and torch.isfinite(w).tolist() == [True] * 4
    data = torch.tensor([1.0, float("inf"), float("nan")]).cuda()  # a host value: the real answer
    assert torch.isfinite(data).tolist() == [True, False, False]
    gt.set_value_hook(lambda shape, dtype, reason: 0)  # a value hook still answers first
    assert not bool(torch.isfinite(loss))
    gt.set_value_hook(None)


def test_profiler_with_cuda_activity_records_host_ops(emu: gt.Emulation, capfd: pytest.CaptureFixture[str]) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    model = nn.Linear(16, 16).cuda()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, record_function("fwd"):
        model(torch.randn(4, 16, device="cuda")).sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "fwd" in names and "aten::linear" in names
    err = capfd.readouterr().err
    assert "Failed to record CUDA event" not in err  # the driverless fallback would print this per op
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # CUDA only: host activity instead of an error
        torch.zeros(3, device="cuda") + 1
    assert len(prof.events()) > 0


def test_cuda_generator_pickles_with_its_device_and_state(emu: gt.Emulation) -> None:
    import pickle

    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    h = pickle.loads(pickle.dumps(g))  # DataLoader workers started with spawn receive the sampler's generator
    assert h.device == torch.device("cuda", 0) and h.initial_seed() == 5 and torch.equal(h.get_state(), g.get_state())

    class Seeded(torch.Generator):  # a script's own subclass still constructs
        pass

    assert isinstance(Seeded(), Seeded)


def test_a_known_host_value_is_forgotten_after_an_in_place_device_op(emu: gt.Emulation) -> None:
    t = torch.tensor([1, 2, 3]).cuda()
    assert t.tolist() == [1, 2, 3]  # copied from the host: the value is known
    t.add_(torch.randint(0, 9, (3,), device="cuda"))  # a random draw on the device: its values are not emulated
    assert t.tolist() == [0, 0, 0]  # not the stale [1, 2, 3]
    v = torch.tensor([1, 2, 3]).cuda()
    v.add_(torch.ones(3, dtype=torch.long, device="cuda").cumsum(0))  # host-known operands: computed on the host
    assert v.tolist() == [2, 4, 6]  # 1+1, 2+2, 3+3 (cumsum of ones is 1, 2, 3)
    u = torch.tensor([1, 2, 3]).cuda()
    u.add_(1)  # a number added to a known value: applied on the host too (Note [Counters on the device])
    assert u.tolist() == [2, 3, 4]


@pytest.mark.parametrize(("gpu", "native"), [("v100", False), ("t4", False), ("a100", True)])
def test_bf16_supported_answers_as_torch_does_on_the_real_card(gpu: str, native: bool) -> None:
    # Note [bf16 before Ampere]: torch's default (including_emulation=True) creates a bf16 tensor on a pre-Ampere
    # card, which works, so it says True on a V100 (7.0) and a T4 (7.5); only including_emulation=False checks >= 8.0
    gt.install(gpu)
    try:
        assert torch.cuda.is_bf16_supported() is True
        assert torch.cuda.is_bf16_supported(including_emulation=False) is native
        with torch.autocast("cuda", dtype=torch.bfloat16):  # torch raises here when is_bf16_supported() is False
            y = torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda"))
        assert y.dtype == torch.bfloat16
    finally:
        gt.uninstall()
