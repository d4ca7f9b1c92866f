"""Start-up hook for `gpemu run`: installs the emulated GPU and the run report in the launched Python process.

`gpemu run` puts this directory first on PYTHONPATH, so every Python process the command starts imports this file
at start-up. It acts only when GPEMU_GPU is set, and not in multiprocessing helper processes (DataLoader workers
started with spawn/forkserver, the resource tracker): those must keep running at native speed without emulation;
trainers started by torch.multiprocessing.spawn are marked and emulated (Note [Spawned trainers]).
It then runs the sitecustomize this one shadows, if there is one further down sys.path.
"""

from __future__ import annotations

import os
import sys


def _is_multiprocessing_child() -> bool:
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    return "multiprocessing.spawn" in argv or "multiprocessing.forkserver" in argv or (
        "multiprocessing.resource_tracker" in argv
    )


def _boot() -> None:
    if not os.environ.get("GPEMU_GPU"):
        return
    # a trainer started by torch.multiprocessing.spawn is emulated (Note [Spawned trainers] in torch_backend/ipc.py);
    # dropping the mark keeps its own DataLoader workers native
    marked = os.environ.pop("GPEMU_SPAWNED_TRAINER", None) == "1"
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    trainer = marked and "multiprocessing.spawn" in argv  # not the resource tracker started beside it
    if _is_multiprocessing_child() and not trainer:
        return
    if trainer:
        from gpemu.torch_backend.ipc import per_process_paths

        per_process_paths()
    if os.environ["GPEMU_GPU"] != "real":  # `gpemu run --gpu real`: the real GPU, only the run report
        _install_emulation()
    try:
        from gpemu.report import install_report_from_env

        install_report_from_env()
    except Exception as exc:
        print(f"gpemu: run report disabled ({type(exc).__name__}: {exc})", file=sys.stderr)


def _install_emulation() -> None:
    try:
        from gpemu.torch_backend import install_from_env  # type: ignore[attr-defined]
    except Exception as exc:  # one clear line, and the script still runs (on the CPU, unemulated)
        print(f"gpemu: cannot load the emulated-CUDA backend ({type(exc).__name__}: {exc}); the script runs "
              "WITHOUT GPU emulation", file=sys.stderr)
        return
    try:
        install_from_env()
    except Exception as exc:
        try:  # install() undid its own patches; this also drops what install_from_env set up around it
            from gpemu.torch_backend import uninstall  # type: ignore[attr-defined]

            uninstall()
        except Exception:
            pass
        print(f"gpemu: could not install the emulated GPU ({type(exc).__name__}: {exc}); the script runs "
              "WITHOUT GPU emulation", file=sys.stderr)


def _chain() -> None:
    # Run the sitecustomize we shadow (e.g. Debian's), exactly once.
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_boot()
_chain()
