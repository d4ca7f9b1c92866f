"""torch.distributed under emulation: NCCL process groups - also the default backend - fail with a GpemuError."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import gpemu.torch_backend as gt
from gpemu.errors import GpemuError

ORIGINAL = dist.init_process_group  # at import, before any test installs the emulation


@pytest.mark.parametrize("backend", [None, "cpu:gloo,cuda:nccl"])
def test_default_and_mixed_backends_raise_a_clear_error(emu: gt.Emulation, backend: str | None) -> None:
    # no backend: torch picks NCCL for cuda when CUDA is available, which failed with "no GPUs found"
    with pytest.raises(GpemuError, match="Workaround"):
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:29581", rank=0, world_size=1)
    assert not dist.is_initialized()


def test_gloo_still_initialises_and_uninstall_restores(emu: gt.Emulation) -> None:
    assert dist.init_process_group is not ORIGINAL  # the guarded wrapper
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29582", rank=0, world_size=1)
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()
    gt.uninstall()
    assert dist.init_process_group is ORIGINAL
