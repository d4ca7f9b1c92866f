"""Host-overhead shortcuts keep behaviour: cached per-tensor op keys, fresh(), and the replay path's parameter walk."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import replay
from gpemu.torch_backend import tensor as emu_tensor


def test_cached_key_follows_data_assignment(emu: gt.Emulation) -> None:
    conv = torch.nn.Conv2d(3, 8, 3).cuda()
    w = conv.weight
    assert w._mk == ((8, 3, 3, 3), (27, 9, 3, 1), torch.float32, 0)  # contiguous: 3*3*3=27, 3*3=9, 3, 1
    conv.to(memory_format=torch.channels_last)  # Module._apply does `w.data = ...`: same object, new strides
    assert conv.weight is w
    assert w.stride() == (27, 1, 9, 3)  # channels_last: C=3 innermost, W*C=9, H*W*C=27
    assert w._mk == (w.shape, (27, 1, 9, 3), torch.float32, 0)
    # the op cache keys the foreach list by those cached keys
    key = emu_tensor._key_of([w, w])
    assert key == (list, (w._mk, w._mk))


def test_int_list_key_matches_the_general_path(emu: gt.Emulation) -> None:
    assert emu_tensor._key_of([1, 2, 3]) == (list, (1, 2, 3))
    assert emu_tensor._key_of((3, True)) == (tuple, (3, True))  # bool is not int here: the general path
    x = torch.zeros(2, device="cuda")
    assert emu_tensor._key_of([1, x]) == (list, (1, x._mk))  # a tensor among ints: the general path, element-wise


def test_fresh_allocates_and_frees_one_rounded_block(emu: gt.Emulation) -> None:
    alloc = emu.devices[0].allocator
    before = alloc.memory_allocated()
    live = emu_tensor.live_storage_count()
    t = emu_tensor.fresh((3, 1000), (1000, 1), torch.float16, 0, "test")
    assert t.device == torch.device("cuda", 0) and t.shape == (3, 1000) and t.dtype == torch.float16
    assert t.stride() == (1000, 1) and t._mk == ((3, 1000), (1000, 1), torch.float16, 0)
    # 3 * 1000 * 2 = 6000 bytes, rounded up to a multiple of 512: 12 * 512 = 6144
    assert alloc.memory_allocated() - before == 6144
    assert emu_tensor.live_storage_count() == live + 1
    view = t[1]  # a view shares the storage: no new allocation, freed with the last wrapper
    del t
    assert alloc.memory_allocated() - before == 6144
    del view
    assert alloc.memory_allocated() == before
    assert emu_tensor.live_storage_count() == live


def test_param_walk_matches_module_parameters_and_sees_hooks(emu: gt.Emulation) -> None:
    emb = torch.nn.Embedding(10, 4).cuda()
    head = torch.nn.Linear(4, 10).cuda()
    head.weight = emb.weight  # tied weights: listed once, in module.parameters() order
    model = torch.nn.Sequential(emb, torch.nn.Sequential(torch.nn.ReLU(), head))
    got = replay._params_if_hook_free(model)
    assert [id(p) for p in got] == [id(p) for p in model.parameters()]
    assert len(got) == 2  # the tied weight once + head.bias
    handle = model[1][0].register_forward_hook(lambda m, i, o: None)
    assert replay._params_if_hook_free(model) == []
    handle.remove()
    assert len(replay._params_if_hook_free(model)) == 2


def test_param_walk_keeps_module_order_with_a_shared_submodule(emu: gt.Emulation) -> None:
    shared = torch.nn.Linear(2, 2).cuda()
    first = torch.nn.Sequential(torch.nn.Linear(2, 2), shared).cuda()
    model = torch.nn.Sequential(first, torch.nn.Linear(2, 2), shared).cuda()  # `shared` reached twice
    got = replay._params_if_hook_free(model)
    # pre-order, first visit wins: first[0].weight/bias, shared.weight/bias, model[1].weight/bias = 6 tensors
    assert [id(p) for p in got] == [id(p) for p in model.parameters()]
    assert len(got) == 6


def test_a_wrapper_without_a_cached_key_is_not_cached(emu: gt.Emulation) -> None:
    x = torch.zeros(4, device="cuda")
    del x._mk  # as if built by a path that did not key it: the class default None applies
    assert x._mk is None
    assert emu_tensor._op_key(torch.ops.aten.add.Tensor, (x, x), {}, emu) is None  # no key: the generic path
    assert emu_tensor._key_of([x, x]) is None  # the general path sees a tensor with no key
    assert (x + 1).shape == (4,)  # and the op still runs


def test_block_sizes_packs_small_pool_tensors_up_to_1_mib() -> None:
    mib = 2**20
    # 100 B -> 512; 600_000 B -> 1172 * 512 = 600_064; 1000 B -> 1024; 2 MiB is large-pool: an allocation of its own
    # packs: 512 + 600_064 = 600_576 (another 600_064 would pass 1 MiB), then 600_064 + 1024 = 601_088; 0 B: none
    assert emu_tensor.block_sizes([100, 2 * mib, 600_000, 600_000, 0, 1000]) == [2 * mib, 600_576, 601_088]
    assert emu_tensor.block_sizes([mib, mib]) == [mib, mib]  # 1 MiB is still small-pool; two do not share a pack
    assert emu_tensor.block_sizes([0, 0]) == []


def test_block_wrappers_share_allocations_until_the_last_dies(emu: gt.Emulation) -> None:
    alloc = emu.devices[0].allocator
    before, n_alloc = alloc.memory_allocated(), alloc.memory_stats()["allocation.all.current"]
    metas = [((3, 1000), (1000, 1), torch.float16, 0), ((64,), (1,), torch.float32, 0)]
    # 3 * 1000 * 2 = 6000 B -> 6144 and 64 * 4 = 256 B -> 512: both small-pool, one pack of 6656
    sizes = emu_tensor.block_sizes([6000, 256])
    assert sizes == [6656]
    a, b = emu_tensor.fresh_block(metas, sizes, "test", alloc, 0)
    assert alloc.memory_allocated() - before == 6656
    assert alloc.memory_stats()["allocation.all.current"] == n_alloc + 1
    assert a.shape == (3, 1000) and a.dtype == torch.float16 and a.device == torch.device("cuda", 0)
    assert b.stride() == (1,) and b._mk == metas[1]
    assert "_elem" not in a.__dict__  # no meta tensor until an op needs one
    view = a[1]  # an op on the wrapper builds its meta tensor; the view shares that storage
    assert "_elem" in a.__dict__ and view.shape == (1000,)
    assert (b * 2).shape == (64,)  # an out-of-place op on the other one: a new allocation, freed with its result
    assert alloc.memory_allocated() - before == 6656
    del a, b
    assert alloc.memory_allocated() - before == 6656  # the view keeps the pack alive
    del view
    assert alloc.memory_allocated() == before
    assert alloc.memory_stats()["allocation.all.current"] == n_alloc


def test_a_cached_foreach_list_output_is_built_as_block_wrappers(emu: gt.Emulation) -> None:
    # Note [Foreach outputs]: 12 gradients -> 12 norms; the second call is an op-cache hit and builds them as blocks
    alloc = emu.devices[0].allocator
    grads = [torch.zeros(100 + i, device="cuda") for i in range(12)]
    first = torch._foreach_norm(grads)
    del first
    before = alloc.memory_allocated()
    norms = torch._foreach_norm(grads)
    assert all("_own" in n.__dict__ and "_elem" not in n.__dict__ for n in norms)
    assert [n.shape for n in norms] == [()] * 12 and norms[0].dtype == torch.float32
    # a 4-byte scalar takes a 512-byte block either way: 12 x 512 = 6144 bytes, one small-pool pack
    assert alloc.memory_allocated() - before == 12 * 512
    total = torch.stack(norms)  # an op on them builds their meta tensors on first use
    assert total.shape == (12,)
    del norms
    assert alloc.memory_allocated() - before == 512  # only the stacked 48 bytes -> 512 are left
    short = torch._foreach_norm(grads[:3])  # under 8 outputs: one by one
    assert not any("_own" in n.__dict__ for n in short)


def test_grad_scaler_unscale_leaves_gradients_unwrapped(emu: gt.Emulation) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(4, 8, device="cuda")
    for _ in range(4):  # calls 1-2 record, 3-4 replay: gradients are block wrappers without meta tensors
        scaler.scale(model(x).sum()).backward()
        scaler.unscale_(opt)
        grads = [p.grad for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        if emu.replay.replayed:
            assert all("_own" in g.__dict__ and "_elem" not in g.__dict__ for g in grads)
        del grads
        opt.zero_grad()
    assert emu.replay.replayed == 2 and scaler.get_scale() == 65536.0  # finite gradients: the scale is unchanged
