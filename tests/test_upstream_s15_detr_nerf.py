"""Session 15 upstream runs: facebookresearch/detr's main.py and yenchenlin/nerf-pytorch's run_nerf.py, each idiom
reproduced in a few lines of plain PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gpemu.torch_backend as gt
from gpemu.torch_backend.tensor import EmuTensor


def test_legacy_constructor_follows_a_cuda_default_tensor_type() -> None:
    # Note [Legacy constructor under a cuda default type]: nerf-pytorch's run_nerf.py calls
    # `torch.set_default_tensor_type('torch.cuda.FloatTensor')` in __main__, and its volume rendering appends
    # `torch.Tensor([1e10])` to the sample distances of a [rays, samples] tensor built by the default-device
    # factories. On a GPU the legacy constructor builds a cuda tensor of the default type; under gpemu it stayed on the
    # CPU and the first training step died in `torch.cat` ("Expected all tensors to be on the same device").
    gt.install("a100")
    try:
        torch.set_default_tensor_type("torch.cuda.FloatTensor")
        try:
            z_vals = torch.linspace(2.0, 6.0, steps=64).expand([1024, 64])  # near 2, far 6, 64 coarse samples
            dists = z_vals[..., 1:] - z_vals[..., :-1]
            far = torch.Tensor([1e10])
            assert isinstance(far, EmuTensor) and far.dtype == torch.float32 and far.tolist() == [1e10]
            dists = torch.cat([dists, far.expand(dists[..., :1].shape)], -1)
            assert isinstance(dists, EmuTensor) and tuple(dists.shape) == (1024, 64)
            # run_nerf_helpers' mse2psnr: -10 * log(mse) / log(torch.Tensor([10.])); for a known mse of 0.01 that is
            # -10 * log10(0.01) = -10 * -2 = 20 dB, computed from host-known values on the emulated device
            psnr = -10.0 * torch.log(torch.Tensor([0.01])) / torch.log(torch.Tensor([10.0]))
            assert psnr.is_cuda and psnr.item() == float(np.float32(20.0))
            # sizes, numpy data (float64 -> the default float32, as `torch.Tensor(target)` of an image) and tensors
            empty = torch.Tensor(3, 4)
            assert isinstance(empty, EmuTensor) and tuple(empty.shape) == (3, 4)
            pose = torch.Tensor(np.eye(4)[:3, :4])
            assert isinstance(pose, EmuTensor) and pose.dtype == torch.float32 and pose.tolist()[2] == [0, 0, 1, 0]
            # subclasses keep their own constructors (nn.Parameter, Tensor subclasses)
            assert isinstance(torch.nn.Parameter(torch.zeros(2)), EmuTensor)

            class Sub(torch.Tensor):
                pass

            assert Sub([1.0]).device.type == "cpu"
        finally:
            torch.set_default_tensor_type(torch.FloatTensor)
        assert not torch.Tensor([1.0]).is_cuda  # back to the CPU type
    finally:
        gt.uninstall()
    assert "__new__" not in torch.Tensor.__dict__ and torch.Tensor([1.0]).device.type == "cpu"


_FIXED_ITERATIONS = """
import os, sys, time
import torch
x = torch.ones(256, 256, device="cuda")
for _ in range(3):
    y = (x @ x).relu()  # three matmuls and three relus on the emulated stream
torch.cuda.synchronize()
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
while True:  # run_nerf.py: `for i in trange(1, 200000 + 1)`, fixed in the file
    time.sleep(0.05)
"""


def test_trace_is_written_when_a_signal_stops_the_run(tmp_path: Path, gpemu_run_started: Any) -> None:
    # Note [Trace on SIGTERM]: run_nerf.py fixes 200,001 iterations, so a short run is `timeout 240 gpemu run --trace
    # t.json ...`; the report came back (its SIGTERM handler) but t.json did not (written only at exit). Now the
    # handler writes the trace too: the three 256^3 matmuls and three relus the script queued are in it.
    trace = tmp_path / "t.json"
    proc, _out = gpemu_run_started(["--gpu", "a100", "--trace", str(trace)], _FIXED_ITERATIONS)
    proc.terminate()  # SIGTERM to gpemu run, passed on to the script (Note [Signals to the child])
    assert proc.wait(timeout=60) == 143  # the script died by SIGTERM, as a plain python run does
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e.get("name") for e in events if e.get("ph") == "X"]
    assert names.count("mm.default") == 3 and names.count("relu.default") == 3, names
