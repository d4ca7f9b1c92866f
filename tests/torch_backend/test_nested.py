"""Nested tensors on the emulated device raise an UnsupportedOpError naming the call (Note [Nested tensors])."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.errors import UnsupportedOpError


def _from_emulated_components() -> Any:
    # pytorch/tutorials scaled_dot_product_attention_tutorial.py's generate_rand_batch
    return torch.nested.nested_tensor([torch.randn(3, 8, device="cuda"), torch.randn(5, 8, device="cuda")])


def _jagged_from_emulated_components() -> Any:
    return torch.nested.nested_tensor([torch.randn(3, 8, device="cuda"), torch.randn(5, 8, device="cuda")],
                                      layout=torch.jagged)


def _with_device_argument() -> Any:
    return torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], device="cuda")


def _cpu_nested_moved() -> Any:
    return torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)]).cuda()


CASES = [
    ("strided from emulated components (torch: INTERNAL ASSERT in NestedTensorImpl.cpp)", _from_emulated_components,
     "torch.nested.nested_tensor"),
    ("jagged from emulated components (torch: 'NestedIntNode' object has no attribute 'add')",
     _jagged_from_emulated_components, "torch.nested.nested_tensor"),
    ("device='cuda' argument", _with_device_argument, "torch.nested.nested_tensor"),
    ("a CPU nested tensor moved (torch: NestedTensorImpl doesn't support sizes)", _cpu_nested_moved, ".cuda()"),
]


@pytest.mark.parametrize(("description", "make", "api"), CASES, ids=[c[0].split(" (")[0] for c in CASES])
def test_nested_tensors_on_the_device_name_the_call_and_a_workaround(description: str, make: Callable[[], Any],
                                                                     api: str) -> None:
    gt.install("a100")
    try:
        with pytest.raises(UnsupportedOpError, match="nested tensors") as info:
            make()
        assert api in str(info.value), description
        assert "to_padded_tensor" in str(info.value)
    finally:
        gt.uninstall()


def test_cpu_nested_tensors_still_work_under_emulation() -> None:
    gt.install("a100")
    try:
        nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)])
        assert torch.nested.to_padded_tensor(nt, 0.0).shape == (2, 5, 8)
    finally:
        gt.uninstall()
