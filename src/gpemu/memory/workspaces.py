"""Library workspace policy: how much device memory cuBLAS (and cuDNN) take through the caching allocator."""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from gpemu.hardware import GPUSpec, get_gpu

# Note [Library workspaces]
# cuBLAS: since PyTorch 1.11, ATen/cuda/CublasHandlePool.cpp gives every (cuBLAS handle, stream) pair a workspace
# allocated through the CUDA caching allocator, on the first GEMM that uses it, and keeps it for the life of the
# process; it therefore counts in memory_allocated. Size (parseChosenWorkspaceSize): CUBLAS_WORKSPACE_CONFIG
# ":SIZE_KiB:COUNT[:SIZE:COUNT...]" when set, else 4096 KiB * 2 + 16 KiB * 8 = 8519680 B, or 4096 KiB * 8 = 32 MiB
# on compute capability 9.x/10.x/12.x (Hopper, Blackwell). Handles are per thread and autograd runs backward on
# its own device thread, so a training loop holds two (forward thread and autograd thread) per stream.
# GPEmu's 2023 measurements predate this (their persistent memory has no 8 MiB step), so validation runs with it
# off; predictions for a modern torch turn it on, and so does the drop-in emulator (Note [cuBLAS workspace in the
# drop-in] in gpemu/torch_backend/tensor.py; Emulation.cublas_workspace turns it off).
# cuDNN: convolution workspaces are allocated per call through the caching allocator and freed right after, so
# they only lift the peak, by an amount that depends on the algorithm cuDNN picks on each GPU. Not modelled
# (the reference data show peaks agreeing across GPUs to within ~1%, see bench/memory_validation.py).

DEFAULT_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8519680 B, CublasHandlePool.cpp default
BIG_WORKSPACE_BYTES = 4096 * 1024 * 8  # 33554432 B on sm_90 / sm_100 / sm_120


def parse_workspace_config(config: str) -> int | None:
    """Return the bytes a CUBLAS_WORKSPACE_CONFIG string (":4096:8", ":4096:2:16:8", ":0:0" for none) asks for, None
    if it is unparsable (torch then uses its default)."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        return None
    return sum(int(size_kib) * 1024 * int(count) for size_kib, count in pairs)


def cublas_workspace_bytes(gpu: GPUSpec | str, config: str | None = None) -> int:
    """Return the cuBLAS workspace bytes torch allocates per (handle, stream) on this GPU."""
    if config is None:
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        parsed = parse_workspace_config(config)
        if parsed is not None:
            return parsed
    major = get_gpu(gpu).compute_capability[0]
    return BIG_WORKSPACE_BYTES if major in (9, 10, 12) else DEFAULT_WORKSPACE_BYTES


CUBLAS_THREADS = ("main", "autograd")  # the handles of a training loop: the forward's thread and autograd's


def cublas_kind(thread: str) -> str:
    """Return the allocator's workspace kind of one thread's cuBLAS handle."""
    return f"cublas ({thread} thread)"


def ensure_cublas_workspace(allocator: Any, stream_id: int, size_bytes: int, thread: str | None = None) -> bool:
    """Allocate `thread`'s cuBLAS workspace on `stream_id` once (the calling thread's when None: autograd's inside a
    backward pass); return True when every thread of CUBLAS_THREADS now holds one there."""
    if thread is None:
        thread = "autograd" if torch._C._current_autograd_node() is not None else "main"
    allocator.ensure_workspace(cublas_kind(thread), stream_id, size_bytes)
    return all((cublas_kind(t), stream_id) in allocator._workspaces for t in CUBLAS_THREADS)
