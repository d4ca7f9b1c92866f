"""torch.utils.cpp_extension under emulation: CUDA extensions fail to build at once, so a script's reference
fallback runs (Note [CUDA extensions under emulation])."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpemu.torch_backend.import_hooks import patch_when_imported

if TYPE_CHECKING:
    from gpemu.torch_backend.patches import Patcher

_MODULE = "torch.utils.cpp_extension"

# Note [CUDA extensions under emulation]: scripts that ship their own CUDA kernels JIT-build them with
# torch.utils.cpp_extension.load / load_inline and, like NVlabs' stylegan2-ada-pytorch (torch_utils/custom_ops.py,
# bias_act and upfirdn2d), catch a failed build and fall back to a reference implementation in plain torch ops. The
# kernels of such an extension can never run under gpemu: emulated tensors have no device memory, and a CUDA
# runtime with no driver cannot launch them. Yet with torch.cuda answering an A100, torch's builder picked sm_80 and
# ran nvcc: stylegan2-ada's two plugins compiled for ~35 s or more each (a one-kernel test extension took 35.6 s on
# two cores) before the link failed on a missing libcudart, and on a host with libcudart the build would succeed and
# the first call hand the kernel an emulated tensor's pointer. Without gpemu the same CPU-only torch refuses at once
# (no device to take an arch from), so the fallback ran immediately. A build with CUDA sources (`.cu`/`.cuh`
# files, `cuda_sources=`, or `with_cuda=True`) now raises the RuntimeError a failed build raises, without compiling;
# C++-only builds (CPU ops) go through. On a GPU the fused kernel would run where the fallback prices its several
# elementwise ops; that difference stays (docs: Known limits).

_CUDA_SUFFIXES = (".cu", ".cuh")


def _refuse(name: str) -> RuntimeError:
    return RuntimeError(f"Error building extension '{name}': gpemu does not build CUDA extensions, whose kernels "
                        "cannot run on emulated tensors (Note [CUDA extensions under emulation])")


def _patched_load(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def load(name: str, sources: Any, *args: Any, with_cuda: bool | None = None, **kwargs: Any) -> Any:
        srcs = [sources] if isinstance(sources, str) else list(sources)
        if with_cuda or (with_cuda is None and any(str(s).endswith(_CUDA_SUFFIXES) for s in srcs)):
            raise _refuse(name)
        return orig(name, sources, *args, with_cuda=with_cuda, **kwargs)

    return load


def _patched_load_inline(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, with_cuda: bool | None = None,
                    **kwargs: Any) -> Any:
        if with_cuda or (with_cuda is None and cuda_sources):
            raise _refuse(name)
        return orig(name, cpp_sources, cuda_sources, *args, with_cuda=with_cuda, **kwargs)

    return load_inline


def _patch(module: ModuleType, patcher: Patcher) -> None:
    patcher.set(module, "load", _patched_load(module.load))
    patcher.set(module, "load_inline", _patched_load_inline(module.load_inline))


def apply(patcher: Patcher) -> None:
    """Refuse CUDA extension builds now if cpp_extension is imported, else when it is (Note [CUDA extensions under
    emulation])."""
    patch_when_imported(_MODULE, _patch, patcher)
