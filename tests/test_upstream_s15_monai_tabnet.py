"""Idioms of MONAI's 3-D segmentation tutorial and pytorch-tabnet (session 15) under the drop-in emulation."""

from __future__ import annotations

from typing import Any

import torch

import gpemu.torch_backend as gt


class _Tagged(torch.Tensor):
    """A tensor subclass that carries metadata through ops, as MONAI's MetaTensor does: built with
    `torch.as_tensor(x).as_subclass(cls)` and wrapped by torch's default `__torch_function__` (which calls
    `as_subclass` on every result)."""

    tag: str

    @staticmethod
    def __new__(cls, x: torch.Tensor, tag: str = "") -> _Tagged:
        return torch.as_tensor(x).as_subclass(cls)  # type: ignore[return-value]

    def __init__(self, x: torch.Tensor, tag: str = "") -> None:
        self.tag = tag

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ret = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(ret, _Tagged):
            ret.tag = next((a.tag for a in args if isinstance(a, _Tagged)), "")
        return ret


def test_as_subclass_of_an_emulated_tensor() -> None:
    # Note [Tensor subclasses of emulated tensors]: MONAI's post transforms (Activations(sigmoid=True) on the
    # sliding-window output of unet_training_array.py) build `MetaTensor(cuda_tensor)`, i.e.
    # `torch.as_tensor(x).as_subclass(MetaTensor)`; torch's C++ as_subclass refused an EmuTensor ("the raw Tensor
    # object is already associated to a python object of type EmuTensor").
    gt.install("a100")
    try:
        x = torch.zeros(4, 8, device="cuda", requires_grad=True)  # 32 fp32 = 128 B: one 512 B block
        before = torch.cuda.memory_allocated()
        assert before == 512
        t = _Tagged(x, "affine")
        assert isinstance(t, _Tagged) and t.tag == "affine"
        assert str(t.device) == "cuda:0" and tuple(t.shape) == (4, 8) and t.is_cuda
        assert torch.cuda.memory_allocated() == before  # an alias of x's storage: no new bytes
        assert t.grad_fn is not None  # attached to the graph, as on a GPU (AliasBackward)
        y = torch.sigmoid(t * 2)  # torch's default __torch_function__ wraps each result in the subclass
        assert isinstance(y, _Tagged) and y.tag == "affine" and str(y.device) == "cuda:0"
        y.sum().backward()
        assert x.grad is not None and tuple(x.grad.shape) == (4, 8) and str(x.grad.device) == "cuda:0"
        plain = t.as_subclass(torch.Tensor)  # MetaTensor.as_tensor(): back to a plain device tensor
        assert type(plain) is type(x) and not isinstance(plain, _Tagged)
        # a host copy is the script's own class on the CPU (MONAI's plot_2d_or_3d_image: `.detach().cpu().numpy()`)
        host = t.detach().cpu()
        assert type(host) is _Tagged and host.device.type == "cpu" and host.tag == "affine"
        assert host.numpy().shape == (4, 8) and float(host.numpy().sum()) == 0.0  # computed values read as zeros
        # one emulated class per subclass, named as the subclass
        assert type(_Tagged(torch.ones(3, device="cuda"))) is type(t) and type(t).__name__ == "_Tagged"
        # a host subclass tensor moved to the device stays one (the tutorial's `batch_data[0].to(device)` of a
        # MetaTensor batch), through the subclass' own __torch_function__, which carries its tag over
        held = torch.cuda.memory_allocated()  # x, x.grad and y: 3 x 512 B
        assert held == 3 * 512
        pair = (_Tagged(torch.ones(2, 3), "batch").to("cuda"), _Tagged(torch.ones(2, 3), "batch").cuda())
        assert torch.cuda.memory_allocated() == held + 2 * 512  # each copy: 6 fp32 = 24 B, one 512 B block
        for moved in pair:
            assert isinstance(moved, _Tagged) and moved.tag == "batch"
            assert str(moved.device) == "cuda:0" and tuple(moved.shape) == (2, 3)
        del pair, moved
        assert torch.cuda.memory_allocated() == held
    finally:
        gt.uninstall()
    # host tensors keep torch's own as_subclass
    h = _Tagged(torch.ones(2), "host")
    assert type(h) is _Tagged and h.device.type == "cpu" and h.tag == "host"
