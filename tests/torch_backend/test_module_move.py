"""Moving a module to the emulated GPU keeps parameter identity: tied weights stay tied, early optimizers work."""

from __future__ import annotations

import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend import EmuTensor


def _tied() -> torch.nn.Sequential:
    emb = torch.nn.Embedding(1000, 64)
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight = emb.weight  # GPT-2 style weight tying
    return torch.nn.Sequential(emb, torch.nn.Linear(64, 64), head)


def test_tied_weights_stay_one_tensor_and_are_counted_once(emu: gt.Emulation) -> None:
    model = _tied().cuda()
    assert model[2].weight is model[0].weight and isinstance(model[0].weight, EmuTensor)
    assert len(list(model.parameters())) == 3  # tied weight, then the middle Linear's weight and bias
    # 1000*64*4 = 256000 (tied, once) + 64*64*4 = 16384 + bias 64*4 = 256 -> one 512-byte block: 272896
    assert torch.cuda.memory_allocated() == 272896


def test_an_optimizer_built_before_the_move_steps_the_emulated_parameters(emu: gt.Emulation) -> None:
    model = _tied()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = [id(p) for p in model.parameters()]
    model.to("cuda")
    assert [id(p) for p in model.parameters()] == ids  # the same Python objects, now emulated
    assert all(isinstance(p, EmuTensor) and isinstance(p, torch.nn.Parameter) for p in opt.param_groups[0]["params"])
    model(torch.randint(0, 1000, (8,), device="cuda")).sum().backward()
    opt.step()
    assert isinstance(opt.state[model[0].weight]["momentum_buffer"], EmuTensor)  # the step ran on the device


def test_later_dtype_moves_keep_the_tie(emu: gt.Emulation) -> None:
    model = _tied().cuda().half()
    assert model[2].weight is model[0].weight and model[0].weight.dtype == torch.float16


def test_a_recurrent_layer_inside_a_moved_module_keeps_its_identity(emu: gt.Emulation) -> None:
    import warnings

    class Encoder(torch.nn.Module):  # pytorch/tutorials seq2seq_translation_tutorial's EncoderRNN
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(50, 16)
            self.gru = torch.nn.GRU(16, 16)

    model = Encoder()
    ids = [id(p) for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the "could not keep its identity" GpemuWarning fails the test
        model.to(torch.device("cuda"))
    assert [id(p) for p in model.parameters()] == ids
    assert all(isinstance(w, EmuTensor) for w in model.gru._flat_weights)  # the GRU's own list: the same objects
    assert [r() for r in model.gru._flat_weight_refs] == model.gru._flat_weights
    out, _h = model.gru(model.embedding(torch.tensor([[1], [2]], device="cuda")))
    assert out.shape == (2, 1, 16) and out.is_cuda


def test_dtype_moves_on_the_device_do_not_warn_about_identity(emu: gt.Emulation, monkeypatch) -> None:
    import warnings

    from gpemu.torch_backend import module_move

    # ultralytics' validator runs `model.float()` on its on-device EMA model, whose BatchNorm buffers torch's
    # Module._apply replaces by new tensors (buffers keep no identity across a dtype change on a GPU either): gpemu
    # warned "a parameter could not keep its identity when moved to the emulated GPU" on every run
    monkeypatch.setattr(module_move, "_warned", False)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).cuda()
    weight = model[0].weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.half()
        model.float()
    assert model[0].weight is weight and weight.dtype == torch.float32  # parameters keep their identity
    assert isinstance(model[1].running_mean, EmuTensor) and model[1].running_mean.dtype == torch.float32


def test_a_dtype_change_on_the_device_changes_compute_and_memory(emu: gt.Emulation) -> None:
    # Note [Set data]: `model.cuda().half()` sets each parameter's `.data`; the wrappers kept their fp32 meta tensors
    # and storages, so a half Linear returned fp32 and memory kept the fp32 bytes
    lin = torch.nn.Linear(1024, 1024).cuda()
    weight = lin.weight
    # fp32: 1024 * 1024 * 4 = 4 MiB of weight + 4 KiB of bias (one 512-byte-rounded block: 4096)
    assert torch.cuda.memory_allocated() == 4 * 2**20 + 4096
    lin.half()
    assert lin.weight is weight and weight.dtype == torch.float16  # identity kept, as on a GPU
    # fp16: 2 MiB + 2 KiB, the fp32 storages freed
    assert torch.cuda.memory_allocated() == 2 * 2**20 + 2048
    out = lin(torch.randn(8, 1024, device="cuda", dtype=torch.float16))
    assert out.dtype == torch.float16  # was torch.float32
    del out
    lin.float()  # and back: 4 MiB + 4 KiB again, besides the first GEMM's cuBLAS workspace (4096 KiB * 2 + 16 KiB * 8
    # before Hopper: Note [cuBLAS workspace in the drop-in])
    assert torch.cuda.memory_allocated() == 4 * 2**20 + 4096 + 4096 * 1024 * 2 + 16 * 1024 * 8
    assert lin(torch.randn(8, 1024, device="cuda")).dtype == torch.float32
