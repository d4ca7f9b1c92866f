"""Idioms of NVlabs' stylegan2-ada-pytorch (train.py, torch_utils/custom_ops.py) under the drop-in emulation."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import pytest
import torch

import gpemu.torch_backend as gt


def _build_bias_act(ce: object, src: Path, build: Path) -> tuple[bool, str, float]:
    # torch_utils/ops/bias_act.py _init(): build the plugin, and on any failure warn and use the reference code
    t0 = time.perf_counter()
    try:
        ce.load(name="bias_act_plugin", sources=[str(src / "bias_act.cpp"), str(src / "bias_act.cu")],  # type: ignore[attr-defined]
                extra_cuda_cflags=["--use_fast_math"], build_directory=str(build), verbose=False)
        return True, "", time.perf_counter() - t0
    except Exception:  # the script catches with a bare `except:`
        return False, traceback.format_exc().splitlines()[-1], time.perf_counter() - t0


def test_cuda_extension_build_fails_fast(tmp_path: Path) -> None:
    # Note [CUDA extensions under emulation]: with torch.cuda answering an A100, torch's builder ran nvcc for sm_80
    # (35.6 s for a one-kernel extension on this 2-core host) and then failed to link libcudart; the build must now
    # fail before compiling anything, so stylegan2-ada's fallback to its reference bias_act/upfirdn2d runs at once.
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    build.mkdir()
    (src / "bias_act.cpp").write_text("#include <torch/extension.h>\n")
    (src / "bias_act.cu").write_text("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    gt.install("a100")
    try:
        import torch.utils.cpp_extension as ce

        assert torch.cuda.is_available()
        built, err, secs = _build_bias_act(ce, src, build)
        assert not built
        assert err.startswith("RuntimeError: Error building extension 'bias_act_plugin'")
        assert "gpemu does not build CUDA extensions" in err
        assert secs < 1.0  # no nvcc: 0.0 s here, 35.6 s of compiling before the fix
        assert list(build.iterdir()) == []  # nothing was written: no build.ninja, no objects
        # load_inline with CUDA sources, and an explicit with_cuda=True, are refused the same way
        with pytest.raises(RuntimeError, match="Error building extension 'inl'"):
            ce.load_inline(name="inl", cpp_sources="", cuda_sources="__global__ void k() {}",
                           build_directory=str(build))
        with pytest.raises(RuntimeError, match="Error building extension 'cc'"):
            ce.load(name="cc", sources=[str(src / "bias_act.cpp")], with_cuda=True, build_directory=str(build))
        # a C++-only build goes on to torch's own builder, which here fails on the missing source file
        with pytest.raises((FileNotFoundError, OSError)):
            ce.load(name="cpu_only", sources=[str(src / "missing.cpp")], build_directory=str(build))
    finally:
        gt.uninstall()
    import torch.utils.cpp_extension as ce_after

    # uninstalling restores torch's own functions
    assert not hasattr(ce_after.load, "__wrapped__")
    assert not hasattr(ce_after.load_inline, "__wrapped__")


def test_cuda_extension_refused_when_imported_before_install(tmp_path: Path) -> None:
    # custom_ops.py imports torch.utils.cpp_extension at the top, possibly before gpemu installs: patched in place
    import torch.utils.cpp_extension as ce

    (tmp_path / "bias_act.cu").write_text("")
    gt.install("a100")
    try:
        built, err, secs = _build_bias_act(ce, tmp_path, tmp_path)
        assert not built and "gpemu does not build CUDA extensions" in err and secs < 1.0
    finally:
        gt.uninstall()
    assert not hasattr(ce.load, "__wrapped__")
