"""Provenance of a profiling run: GPU, driver, CUDA, torch, host CPU and date, as one `source` string."""

from __future__ import annotations

import datetime as _dt
import platform
import re
import subprocess
import warnings
from dataclasses import dataclass

import torch

from gpemu.errors import UnknownNameError
from gpemu.hardware import get_gpu

TOOL = "gpemu-profile"


class UnknownGPUWarning(UserWarning):
    """The profiled GPU is not in the catalog; rows are labelled with a slug of its device name."""


@dataclass(frozen=True)
class Provenance:
    """Facts about the machine a profile was measured on."""

    gpu_key: str  # catalog key, or a slug of the device name when the catalog lacks it
    device_name: str
    driver: str
    cuda: str
    torch: str
    cpu: str
    date: str
    dry_run: bool = False
    emulated: bool = False  # run under gpemu's own emulation: Note [Profiling an emulated GPU]

    @property
    def measured(self) -> int:
        """Return the rows' `measured` flag: 1 only for a real GPU (not a dry run, not an emulated one)."""
        return 0 if self.dry_run or self.emulated else 1

    def source(self, **extra: object) -> str:
        """Return the `source` column text: tool version and every provenance fact, `;`-separated."""
        from gpemu import __version__

        tool = f"{TOOL} v{__version__}" + (" dry-run" if self.dry_run else "") + (" emulated" if self.emulated else "")
        parts = [
            tool,
            f"gpu={self.device_name}",
            f"driver={self.driver}",
            f"cuda={self.cuda}",
            f"torch={self.torch}",
            f"cpu={self.cpu}",
            f"date={self.date}",
        ]
        parts += [f"{k}={v}" for k, v in extra.items()]
        return "; ".join(p.replace(";", ",") for p in parts)


def slugify(name: str) -> str:
    """Return a lower-case, dash-separated slug of a device name ("NVIDIA GH200 480GB" -> "nvidia-gh200-480gb")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def gpu_key_for(device_name: str, warn: bool = True) -> str:
    """Return the catalog key for a device name, or its slug (with an UnknownGPUWarning) when unknown."""
    try:
        return get_gpu(device_name).key
    except UnknownNameError:
        if warn:
            warnings.warn(
                f"GPU {device_name!r} is not in the gpemu catalog; recording rows as {slugify(device_name)!r}",
                UnknownGPUWarning,
                stacklevel=2,
            )
        return slugify(device_name)


def cpu_model() -> str:
    """Return the host CPU model name (from /proc/cpuinfo where available)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def nvidia_driver_version(gpu_index: int = 0) -> str:
    """Return the NVIDIA driver version (pynvml, else nvidia-smi), or "unknown"."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={gpu_index}", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0] or "unknown"
    except Exception:
        return "unknown"


# Note [Profiling an emulated GPU]
# `gpemu run --gpu h200 -- gpemu profile ...` runs the profiler against the emulated device: every figure is then the
# emulator's prediction in the profile format (bench/op_validation.py compares such per-op files with measured ones).
# Such rows once came out labelled measured=1 with the emulated GPU's name (session 12 caught it), and a merge would
# have let them replace real measurements. They are measured=0, "emulated" in the tool field, and the device name
# says so.
def _emulating() -> bool:
    """Return True when gpemu's emulation stands in for CUDA in this process."""
    try:
        from gpemu.torch_backend.state import current_emulation
    except ImportError:  # pragma: no cover - the torch backend always ships with the profiler
        return False
    return current_emulation() is not None


def collect(gpu_index: int = 0, dry_run: bool = False, gpu_name: str | None = None) -> Provenance:
    """Return the provenance of this machine; on a dry run the "GPU" is the host CPU."""
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cpu = cpu_model()
    if dry_run:
        device_name = gpu_name or f"cpu {cpu}"
        key = gpu_key_for(gpu_name, warn=True) if gpu_name else "dry-run-cpu"
        return Provenance(key, device_name, "none", "none", torch.__version__, cpu, date, dry_run=True)
    device_name = torch.cuda.get_device_name(gpu_index)
    key = gpu_key_for(gpu_name or device_name)
    if _emulating():  # See Note [Profiling an emulated GPU]
        return Provenance(key, f"{device_name} (emulated by gpemu)", "none", "emulated", torch.__version__, cpu, date,
                          emulated=True)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cuda = f"{torch.version.cuda}" + (f" cudnn {cudnn}" if cudnn else "")
    return Provenance(key, device_name, nvidia_driver_version(gpu_index), cuda, torch.__version__, cpu, date)
