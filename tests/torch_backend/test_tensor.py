"""EmuTensor: device identity, memory by storage, values, autograd, data-dependent shapes, errors, saving."""

from __future__ import annotations

import io
import os

import pytest
import torch

import gpemu.torch_backend as gt


def test_device_identity(emu: gt.Emulation) -> None:
    x = torch.zeros(4, 8, device="cuda")
    assert isinstance(x, gt.EmuTensor)
    assert x.device == torch.device("cuda", 0) and x.is_cuda and x.get_device() == 0
    assert not torch.zeros(2).is_cuda  # CPU tensors stay plain


def test_memory_tracks_storages_not_views(emu: gt.Emulation) -> None:
    alloc = emu.devices[0].allocator
    base = alloc.memory_allocated()
    x = torch.empty(1024, 256, device="cuda")  # 1024 * 256 * 4 = 1048576 bytes
    assert alloc.memory_allocated() - base == 1048576
    v = x[:10].t()  # a view shares the storage: no new bytes
    assert alloc.memory_allocated() - base == 1048576
    del x
    assert alloc.memory_allocated() - base == 1048576  # the view keeps the storage alive
    del v
    assert alloc.memory_allocated() == base
    assert torch.cuda.memory_allocated() == alloc.memory_allocated()


def test_item_and_value_hook(emu: gt.Emulation) -> None:
    loss = torch.randn(8, device="cuda").sum()
    assert loss.item() == 0.0  # values are not computed: zeros by default
    gt.set_value_hook(lambda shape, dtype, reason: 2.5 if reason == "tensor.item()" else None)
    assert loss.item() == 2.5
    assert f"{loss:.1f}" == "2.5"
    assert torch.randn(3, device="cuda").cpu().tolist() == [0.0, 0.0, 0.0]  # hook declines -> zeros
    assert torch.ones(3, device="cuda").cpu().tolist() == [1.0, 1.0, 1.0]  # a host-known constant is its value


def test_autograd_through_conv_bn_linear(emu: gt.Emulation) -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5)
    ).cuda()
    opt = torch.optim.Adam(model.parameters())
    out = model(torch.randn(2, 3, 8, 8).cuda())
    assert out.shape == (2, 5) and out.device.type == "cuda"  # (8 - 3 + 1) = 6
    out.sum().backward()
    opt.step()
    grad = model[0].weight.grad
    assert grad is not None and grad.shape == (8, 3, 3, 3) and grad.is_cuda


def test_nonzero_policy(emu: gt.Emulation) -> None:
    x = torch.rand(10, 4, device="cuda")  # computed: its values are unknown
    assert torch.nonzero(x).shape == (40, 2)  # worst case: all 10 * 4 = 40 elements selected
    emu.nonzero_fraction = 0.25
    assert x[x > 0].shape == (10,)  # ceil(40 * 0.25) = 10
    # a value the host knows selects its real count (Note [Nonzero bounds]): zeros select none
    assert torch.nonzero(torch.zeros(10, 4, device="cuda")).shape == (0, 2)


def test_cpu_tensor_meeting_a_cuda_tensor_raises_as_on_a_gpu(emu: gt.Emulation) -> None:
    # Note [Tensors on two devices]: a forgotten `.to(device)` dies on a GPU; it ran under gpemu before
    emb = torch.nn.Embedding(100, 16).cuda()
    with pytest.raises(RuntimeError, match="same device"):
        emb(torch.randint(0, 100, (4, 8)))  # CPU token ids into a CUDA embedding (index_select on the card)
    with pytest.raises(RuntimeError, match="same device"):
        torch.nn.Linear(16, 4).cuda()(torch.randn(2, 16))
    with pytest.raises(RuntimeError, match="same device"):
        torch.nn.functional.nll_loss(torch.randn(4, 10, device="cuda"), torch.tensor([1, 2, 3, 4]))
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3, device="cuda") + torch.randn(3)
    # what a GPU accepts: a 0-dim CPU tensor (a scalar), CPU indices, copies, CTC's CPU lengths
    x = torch.randn(5, 3, device="cuda")
    assert (x * torch.tensor(2.0)).is_cuda and x[torch.tensor([0, 2])].shape == (2, 3)
    x[torch.tensor([1])] = torch.zeros(1, 3, device="cuda")
    x.copy_(torch.ones(5, 3))
    # Note [Host tensors indexed on the device]: device indices into a host table (a scheduler's `alphas_cumprod[t]`)
    # raise on a GPU; gpemu returned a (5,)-shaped emulated tensor before
    table, steps = torch.linspace(1.0, 0.0, 1000), torch.randint(0, 1000, (5,), device="cuda")
    with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same device"):
        table[steps]
    assert table[steps.cpu()].shape == (5,) and table.to("cuda")[steps].is_cuda  # the two fixes a GPU accepts
    logits = torch.randn(50, 4, 30, device="cuda", requires_grad=True)
    lengths_in, lengths_tgt = torch.full((4,), 50, dtype=torch.long), torch.full((4,), 12, dtype=torch.long)
    loss = torch.nn.functional.ctc_loss(logits.log_softmax(2), torch.randint(1, 30, (4, 12)), lengths_in, lengths_tgt)
    loss.backward()
    assert loss.is_cuda and logits.grad is not None


def test_type_as_moves_across_devices_in_every_grad_mode(emu: gt.Emulation) -> None:
    # Note [type_as across devices]: `t.type_as(other)` is `t.to(other's dtype and device)`; ultralytics'
    # make_anchors runs `torch.arange(w).type_as(feats[0])`: a plain meta tensor came back in autograd mode, and its
    # inference-mode validation raised "Expected all tensors to be on the same device" (a GPU moves the tensor)
    feats = torch.randn(2, 8, device="cuda", dtype=torch.float16)
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with mode():
            h2d_before = emu.devices[0].stats.h2d_bytes
            sx = torch.arange(20).type_as(feats)
            assert sx.is_cuda and sx.dtype == torch.float16 and sx.shape == (20,)
            assert emu.devices[0].stats.h2d_bytes - h2d_before == 20 * 8  # the int64 arange is copied, then cast
            back = feats.type_as(torch.zeros(1))
            assert not back.is_cuda and back.dtype == torch.float32 and back.shape == (2, 8)
            assert feats.type_as(torch.empty(1, device="cuda", dtype=torch.float32)).dtype == torch.float32
            assert feats.type_as(feats) is feats  # no change: itself
    with torch.inference_mode():  # the aten op reaches dispatch whole only here (autograd mode decomposes it first)
        via_aten = torch.ops.aten.type_as(torch.arange(3), feats)
        assert via_aten.is_cuda and via_aten.dtype == torch.float16


def test_tensors_in_lists_and_on_two_gpus_raise_as_on_a_gpu() -> None:
    # Note [Tensors on two devices]: lists are checked too (torch.cat names wrapper_CUDA_cat on a GPU), and so are
    # two emulated devices; both ran silently on cuda:0 before
    gt.install("a100", count=2)
    try:
        a, b, c = torch.randn(4, 3, device="cuda"), torch.randn(4, 3, device="cuda:1"), torch.randn(4, 3)
        for call in (lambda: torch.cat([a, c]), lambda: torch.stack([c, a]), lambda: torch.cat([a, b]),
                     lambda: a + b, lambda: a * torch.tensor(2.0, device="cuda:1"),
                     lambda: torch._foreach_add([a, a], [a, c]), lambda: torch._foreach_add_([a, b], [b, a])):
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                call()
        # what a GPU runs: 0-dim CPU scalars; foreach lists spanning devices (torch's per-tensor slow path); the
        # packed CPU `scalars` of _foreach_addcdiv_.Tensor (which raised before); copies and transfers across GPUs
        assert torch.cat([a, a]).shape == (8, 3) and torch._foreach_mul([a, a], torch.tensor(2.0))[0].is_cuda
        torch._foreach_add_([a, b], [torch.tensor(1.0), b])
        torch._foreach_addcdiv_([a, a], [a, a], [a, a], torch.tensor([0.1, 0.2]))
        a.copy_(b)
        assert a.to("cuda:1").device == torch.device("cuda", 1)
        # a module that replays (recorded on cuda:0) given an input on cuda:1: the replay key has the device, so
        # the call runs per op and raises; it replayed on cuda:0 before
        m = torch.nn.Linear(3, 2).cuda()
        for _ in range(4):
            m(torch.randn(4, 3, device="cuda")).sum().backward()
        with pytest.raises(RuntimeError, match="cuda:0 and cuda:1"):
            m(torch.randn(4, 3, device="cuda:1"))
    finally:
        gt.uninstall()


def test_numpy_needs_cpu_like_cuda(emu: gt.Emulation) -> None:
    with pytest.raises(TypeError, match="cpu"):
        torch.zeros(2, device="cuda").numpy()
    assert torch.zeros(2, device="cuda").cpu().numpy().shape == (2,)


def test_torch_save_loads_anywhere(emu: gt.Emulation) -> None:
    model = torch.nn.Linear(4, 3).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4, device="cuda")).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)  # weights_only=True by default: only plain tensors inside
    assert ckpt["model"]["weight"].shape == (3, 4) and ckpt["model"]["weight"].device.type == "cpu"
    assert ckpt["opt"]["state"][0]["momentum_buffer"].shape == (3, 4)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_torch_save_holds_no_host_copy_of_what_it_has_not_written(emu: gt.Emulation) -> None:
    # Note [Host zeros on demand]: torch.save pickles every tensor (each a host read, Note [Saving emulated tensors])
    # before it writes any; a GPU run holds nothing on the host meanwhile. Four 64 MiB weights as their pickled host
    # copies: 4 * 4096 * 4096 * 4 B = 256 MiB resident before the fix, nothing after (well under 32 MiB).
    weights = [torch.empty(4096, 4096, device="cuda") for _ in range(4)]
    before = _resident_bytes()
    pickled = [w.__reduce_ex__(2) for w in weights]  # what torch.save's pickler holds until it writes
    grown = _resident_bytes() - before
    assert grown < 32 * 2**20, grown
    buf = io.BytesIO()
    torch.save(weights[0], buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded.shape == (4096, 4096) and loaded.dtype == torch.float32 and not loaded.any()
    del pickled


def test_uninstall_restores_torch() -> None:
    before = (torch.cuda.is_available, torch.Tensor.to, torch.zeros, torch.accelerator.device_count)
    gt.install("a100", count=2)
    assert torch.cuda.device_count() == 2 and torch.cuda.get_device_name(1) == "NVIDIA A100-SXM4-80GB"
    gt.uninstall()
    assert (torch.cuda.is_available, torch.Tensor.to, torch.zeros, torch.accelerator.device_count) == before
    assert gt.current_emulation() is None


def test_host_waits_inside_ops_are_not_counted_as_emulator_time(emu: gt.Emulation) -> None:
    import time

    from gpemu.torch_backend.tensor import emulator_host_time

    x = torch.empty(4096, 4096, device="cuda")
    for _ in range(3):  # 3 x 2*4096^3 = 412 GFLOP: ~30 ms or more queued on an emulated V100 (15.7 TFLOP/s peak)
        x = x @ x
    before_s = emulator_host_time()[0]
    t0 = time.perf_counter()
    x.sum().item()  # aten._local_scalar_dense waits for the queue inside gpemu's op handling
    waited_s = time.perf_counter() - t0
    spent_s = emulator_host_time()[0] - before_s
    assert waited_s > 0.02
    assert spent_s < 0.25 * waited_s  # the wait is the GPU's time, not the emulator's
