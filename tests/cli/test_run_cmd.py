"""`gpemu run`: exit code passthrough, GPEMU_* environment, start-up hook, bad input exits 2 without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpemu.cli.run_cmd import BOOT_DIR, build_env, parse_size
from gpemu.errors import GpemuError, UnknownNameError


def _gpemu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpemu", *args], capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [
        ("10GiB", 10 * 1024**3),  # 10 * 2^30 = 10737418240
        ("512MiB", 512 * 1024**2),  # 536870912
        ("16GB", 16 * 10**9),
        ("1.5 GiB", 1610612736),  # 1.5 * 2^30
        ("4096", 4096),
    ],
)
def test_parse_size(text: str, size_bytes: int) -> None:
    assert parse_size(text) == size_bytes


@pytest.mark.parametrize("text", ["10Gx", "", "-1GiB", "0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(GpemuError):
        parse_size(text)


def test_build_env_sets_everything() -> None:
    env = build_env("Tesla V100-PCIE-32GB", 2, "resnet50", None, None, "1GiB", base={"PYTHONPATH": "/x", "PATH": "/bin"})
    assert env["GPEMU_GPU"] == "v100-pcie-32gb"  # any alias resolves to the catalog key
    assert env["GPEMU_COUNT"] == "2"
    assert env["GPEMU_MODEL"] == "resnet50"
    assert env["GPEMU_MEMORY_LIMIT"] == str(1024**3)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/x"]
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert "GPEMU_TRACE" not in env
    with pytest.raises(UnknownNameError, match="v100"):
        build_env("v1000", 1, None, None, None, None, base={})


def test_exit_code_and_environment_pass_through() -> None:
    code = (
        "import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('GPEMU')}));"
        " sys.exit(3)"
    )
    proc = _gpemu("run", "--gpu", "a100", "--count", "2", "--", "python", "-c", code)
    assert proc.returncode == 3
    env = json.loads(proc.stdout.strip().splitlines()[-1])
    assert env["GPEMU_GPU"] == "a100-sxm4-80gb" and env["GPEMU_COUNT"] == "2"
    assert "Traceback" not in proc.stderr  # whatever state the torch backend is in, no traceback at start-up


def test_unknown_gpu_exits_2_with_closest_names() -> None:
    proc = _gpemu("run", "--gpu", "v1000", "--", "python", "-c", "print('never')")
    assert proc.returncode == 2
    assert "v1000" in proc.stderr and "v100" in proc.stderr
    assert "never" not in proc.stdout and "Traceback" not in proc.stderr


def test_missing_command_exits_2() -> None:
    proc = _gpemu("run", "--gpu", "v100")
    assert proc.returncode == 2 and "no command" in proc.stderr


def test_boot_hook_is_inert_without_gpemu_gpu() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPEMU")}
    env["PYTHONPATH"] = str(BOOT_DIR)
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; print('gpemu.torch_backend' in sys.modules)"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False" and proc.stderr == ""


DROPIN_SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(32, 32), torch.randint(0, 4, (32,)))
for x, y in DataLoader(data, batch_size=8):
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    opt.zero_grad(); loss.backward(); opt.step()
    loss.item()
"""


def test_dropin_run_writes_report_and_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    backend = pytest.importorskip("gpemu.torch_backend")
    if not hasattr(backend, "install_from_env"):
        pytest.skip("torch backend has no install_from_env yet")
    script = tmp_path / "train.py"
    script.write_text(DROPIN_SCRIPT)
    report, trace = tmp_path / "r.json", tmp_path / "t.json"
    proc = _gpemu("run", "--gpu", "v100", "--report-json", str(report), "--trace", str(trace), "--",
                  "python", str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads(report.read_text())
    assert saved["complete"] is True and saved["gpu"] == "v100-pcie-32gb"
    rows = saved["iterations"]
    assert len(rows) == 4  # 32 samples / batch 8; the exhausted fetch opens no iteration
    for row in rows:
        assert row["gpu_busy_s"] > 0 and row["h2d_bytes"] == 8 * 32 * 4 + 8 * 8  # fp32 inputs + int64 labels
        assert row["gpu_busy_s"] + row["gpu_idle_s"] == pytest.approx(row["wall_s"])
    assert "gpemu run report" in proc.stderr
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert "data wait" in names and "iteration 0" in names


def test_real_gpu_mode_records_iterations_without_emulating(tmp_path: os.PathLike[str]) -> None:
    # the reference side of `gpemu validate`: the script runs on whatever the machine has (here the CPU), nothing is
    # patched, and the run report still times its iterations (here: 4 optimizer steps = 4 boundaries: 3 iterations
    # closed by the next step, the 4th closed at exit and flagged partial)
    code = (
        "import torch; w = torch.nn.Parameter(torch.zeros(4)); opt = torch.optim.SGD([w], lr=0.1)\n"
        "assert not isinstance(torch.zeros(1), type(None)) and torch.zeros(1).device.type == 'cpu'\n"
        "import sys; sys.exit(0 if torch.cuda.is_available.__module__ == 'torch.cuda' else 4)\n"
    )
    loop = "for _ in range(4):\n    w.sum().backward(); opt.step()\n"
    report = os.path.join(tmp_path, "real.json")
    proc = _gpemu("run", "--gpu", "real", "--report-json", report, "--", "python", "-c", code.replace(
        "import sys", loop + "import sys"))
    assert proc.returncode == 0, proc.stderr  # 4 would mean torch.cuda was patched (emulation installed)
    assert "GPU busy" not in proc.stderr and "device activity is not measured" in proc.stderr
    with open(report, encoding="utf-8") as fh:
        data = json.load(fh)
    assert data["gpu"].startswith("real ") and len(data["iterations"]) == 4
    assert [bool(it.get("partial")) for it in data["iterations"]] == [False, False, False, True]
    validate = _gpemu("validate", "--gpu-run", report, "--emulated-run", report, "--json", "--warmup", "0")
    assert validate.returncode == 0 and json.loads(validate.stdout)["median_abs_error_pct"] == 0.0


def test_a_script_killed_by_a_zero_read_gets_the_float_value_hint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "psnr.py"
    script.write_text("import math, torch\nmse = (torch.randn(4, device='cuda') ** 2).mean()\n"
                      "print(10 * math.log10(1 / mse.item()))\n")
    proc = _gpemu("run", "--gpu", "a100", "--", sys.executable, str(script))
    assert proc.returncode == 1 and "ZeroDivisionError" in proc.stderr  # mse reads back as 0.0 by default
    assert "GPEMU_FLOAT_VALUE=1" in proc.stderr


def test_run_plot_draws_the_report_without_a_report_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Note [Iteration plot]: --plot alone keeps a temporary report for the plot
    pytest.importorskip("matplotlib")
    script = tmp_path / "train.py"
    script.write_text(DROPIN_SCRIPT)
    out = tmp_path / "iterations.png"
    proc = _gpemu("run", "--gpu", "v100", "--plot", str(out), "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes()[:4] == b"\x89PNG" and "plot written to" in proc.stderr
