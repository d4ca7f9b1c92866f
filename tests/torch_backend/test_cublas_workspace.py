"""cuBLAS's workspace: the first GEMM of each thread and stream takes it from the caching allocator, for good."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt

HOPPER_WS = 4096 * 1024 * 8  # 32 MiB on compute capability 9.x (CublasHandlePool.cpp's default there)
DEFAULT_WS = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680 B before Hopper
replayed: list[int] = []  # forwards replayed by each _linear_step call


def _linear_step(gpu: str, replay: bool = False, steps: int = 1) -> list[int]:
    """memory_allocated() after .cuda(), then after each forward and each backward of a Linear(1024, 1024)."""
    emu = gt.install(gpu, replay=replay)
    try:
        lin = torch.nn.Linear(1024, 1024).cuda()
        x = torch.randn(64, 1024, device="cuda")
        seen = [torch.cuda.memory_allocated()]
        for _ in range(steps):
            y = lin(x)
            seen.append(torch.cuda.memory_allocated())
            y.sum().backward()
            del y
            seen.append(torch.cuda.memory_allocated())
        replayed.append(emu.replay.replayed if emu.replay is not None else 0)
        return seen
    finally:
        gt.uninstall()


def test_the_first_gemm_of_each_thread_allocates_the_workspace() -> None:
    # Note [cuBLAS workspace in the drop-in]. Parameters: 1024 * 1024 * 4 = 4,194,304 B of weight + 4,096 of bias;
    # input 64 * 1024 * 4 = 262,144 B: 4,460,544 after .cuda() and randn, no workspace yet (no GEMM has run).
    params_input = 4_194_304 + 4_096 + 262_144
    cuda, fwd, bwd = _linear_step("h200")
    assert cuda == params_input
    # the forward's addmm: + the output 262,144 B + the forward thread's 32 MiB workspace
    assert fwd == params_input + 262_144 + HOPPER_WS
    # the backward (autograd's thread, its own handle): + 32 MiB, + the weight and bias gradients (4,194,304 + 4,096)
    # less the output freed by `del y` (its gradient was a transient)
    assert bwd == params_input + 2 * HOPPER_WS + 4_194_304 + 4_096
    # an A100: 8,519,680 B each
    assert _linear_step("a100")[2] == params_input + 2 * DEFAULT_WS + 4_194_304 + 4_096


def test_the_workspace_follows_cublas_workspace_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # ":4096:8" asks for 8 chunks of 4096 KiB = 32 MiB on any GPU; ":16:8" for 128 KiB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    cuda, fwd, _ = _linear_step("h200")
    assert fwd - cuda == 262_144 + 16 * 1024 * 8
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # none at all: the output alone
    cuda, fwd, bwd = _linear_step("h200")
    assert (fwd - cuda, bwd - cuda) == (262_144, 4_194_304 + 4_096)


def test_replay_leaves_the_workspace_out_of_the_module() -> None:
    # the workspace is allocated inside the first recorded forward; replayed steps must neither hold it again as saved
    # activations nor free it: every step after the first ends where the per-op steps end
    per_op = _linear_step("h200", replay=False, steps=5)
    with_replay = _linear_step("h200", replay=True, steps=5)
    assert replayed[-1] == 3  # steps 1-2 record, 3-5 replay
    assert with_replay == per_op
    assert per_op[-1] == per_op[2]  # steady from the first backward on: two workspaces, weights, gradients, input
