"""Emulated GPUs across processes: tensors sent by torch.multiprocessing (CUDA IPC), and trainers it spawns.

Note [Emulated tensors across processes]: torch.multiprocessing pickles a CUDA tensor as a CUDA IPC handle, so a
Hogwild trainer (pytorch/examples mnist_hogwild: `model.share_memory()`, then the model passed to spawned
processes) shares one copy of the parameters on the GPU. Our tensors have no device memory to share, and plain
pickling (`__reduce_ex__`, Note [Saving emulated tensors]) turned them into temporary CPU zeros whose shared-memory
file descriptor was closed before the child started ("bad value(s) in fds_to_keep"). gpemu registers a
ForkingPickler reducer instead: the receiving process, which runs its own emulation (`gpemu run` installs it in every
Python child through PYTHONPATH but leaves multiprocessing children unemulated, so a spawned child that receives an
emulated tensor installs the emulation then, from the same GPEMU_* settings, with its own run report and trace
written beside the parent's as NAME.pid<PID>.json), rebuilds an emulated tensor of the same shape, strides, dtype, device index and
requires_grad (a Parameter stays a Parameter), allocated on its GPU without a copy. Processes do not share one
emulated GPU: each child's kernels run on its own timeline (they do not contend, as they would on one real GPU) and
its memory is counted in its own allocator. The sender prints a one-line notice saying so. Views are rebuilt as
separate tensors (aliasing across processes is not kept); values are never sent (there are none).
"""

from __future__ import annotations

import functools
import os
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch

from gpemu.errors import GpemuError
from gpemu.torch_backend import state
from gpemu.torch_backend.tensor import EmuTensor, fresh

_notice_shown = False


def rebuild_emulated(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, index: int,
                     requires_grad: bool, is_param: bool) -> torch.Tensor:
    """Return a new emulated tensor in this process for one received from another (see the module note)."""
    emu = state.current_emulation() or _install_here()
    if emu is None:
        raise GpemuError(
            "this process received an emulated CUDA tensor (torch.multiprocessing) but gpemu is not installed in it: "
            "start the script with `gpemu run`, which installs the emulation in every Python child process")
    if index >= len(emu.devices):
        raise GpemuError(f"received a tensor on emulated cuda:{index}, but this process emulates {len(emu.devices)} "
                         "GPU(s): pass the same --count to every process")
    out = fresh(shape, stride, dtype, index, "ipc")
    if is_param:
        return torch.nn.Parameter(out, requires_grad=requires_grad)
    return out.requires_grad_(requires_grad) if requires_grad else out


# Note [Spawned trainers]: `torch.multiprocessing.spawn(main_worker, nprocs=ngpus)` is how pytorch/examples imagenet
# (--multiprocessing-distributed) and many DDP scripts start one trainer per GPU. `gpemu run`'s start-up hook leaves
# multiprocessing children unemulated (DataLoader workers must run at native speed), so the trainer saw no GPU
# ("ProcessGroupNCCL is only supported with GPUs, no GPUs found!"). Under emulation torch.multiprocessing's
# start_processes (behind spawn) marks the children it starts with SPAWN_ENV; the hook emulates a marked child and
# drops the mark, so the trainer's own DataLoader workers stay native. Each trainer writes its report and trace beside
# the parent's as NAME.pid<PID>.json (per_process_paths). A world of more than one rank still raises at
# init_process_group (one trainer per emulated GPU is the next milestone), so nprocs=1 is what runs.
SPAWN_ENV = "GPEMU_SPAWNED_TRAINER"


def per_process_paths() -> None:
    """Point GPEMU_TRACE / GPEMU_REPORT_JSON at NAME.pid<PID>.json so this child never overwrites its parent's."""
    pid = os.getpid()
    for name in ("GPEMU_TRACE", "GPEMU_REPORT_JSON"):
        path = os.environ.get(name)
        if path:
            p = Path(path)
            os.environ[name] = str(p.with_name(f"{p.stem}.pid{pid}{p.suffix}"))


def _patched_start_processes(orig: Any) -> Any:
    @functools.wraps(orig)
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        previous = os.environ.get(SPAWN_ENV)
        os.environ[SPAWN_ENV] = "1"  # children inherit it at start; see Note [Spawned trainers]
        try:
            return orig(*args, **kwargs)
        finally:
            if previous is None:
                os.environ.pop(SPAWN_ENV, None)
            else:
                os.environ[SPAWN_ENV] = previous

    return start_processes


def _install_here() -> Any:
    """Install the emulation in a `gpemu run` child that was left unemulated; return it (None outside gpemu run)."""
    if not os.environ.get("GPEMU_GPU") or os.environ["GPEMU_GPU"] == "real":
        return None
    pid = os.getpid()
    per_process_paths()  # never overwrite the parent's files at this process' exit
    from gpemu.report import install_report_from_env
    from gpemu.torch_backend.emulation import install_from_env

    emu = install_from_env()
    install_report_from_env()
    print(f"gpemu: process {pid} received emulated CUDA tensors: it emulates its own GPU and prints its own report",
          file=sys.stderr)
    return emu


def _reduce(t: EmuTensor) -> Any:
    global _notice_shown
    if not _notice_shown:
        _notice_shown = True
        print("gpemu: emulated CUDA tensors sent to another process (torch.multiprocessing): each process emulates "
              "its own GPU, so their kernels do not contend and memory is counted per process (docs/drop-in.md)",
              file=sys.stderr)
    is_param = isinstance(t, torch.nn.Parameter) or bool(getattr(t, "_is_param", False))
    return rebuild_emulated, (tuple(t.shape), tuple(t.stride()), t.dtype, t._index, bool(t.requires_grad), is_param)


def apply(patcher: Any) -> None:
    """Register the ForkingPickler reducer for emulated tensors through `patcher` (restored at uninstall)."""
    reducers = dict(ForkingPickler._extra_reducers)  # type: ignore[attr-defined]
    reducers[EmuTensor] = _reduce
    patcher.set(ForkingPickler, "_extra_reducers", reducers)
    import torch.multiprocessing as torch_mp

    torch_spawn = sys.modules["torch.multiprocessing.spawn"]  # the attribute `spawn` is the function of that name
    wrapped = _patched_start_processes(torch_spawn.start_processes)
    patcher.set(torch_spawn, "start_processes", wrapped)  # spawn() looks it up here
    patcher.set(torch_mp, "start_processes", wrapped)
