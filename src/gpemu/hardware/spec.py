"""GPUSpec and the catalog loader (the data lives in gpus.toml beside this file)."""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from importlib import resources

from gpemu.errors import UnknownNameError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Peak-throughput keys. 16-bit and 8-bit keys are dense tensor-core peaks; fp32 is the CUDA-core (non-tensor) peak;
# tf32 is the dense TF32 tensor-core peak (0 where the GPU has none).
DTYPE_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "int8", "fp8")


@dataclass(frozen=True)
class GPUSpec:
    """Facts about one GPU model that the timing and memory models need."""

    key: str  # canonical short name, e.g. "v100-pcie-32gb"
    name: str  # what torch.cuda.get_device_name() returns, e.g. "Tesla V100-PCIE-32GB"
    aliases: tuple[str, ...]
    arch: str  # "volta", "ampere", ...
    compute_capability: tuple[int, int]
    sm_count: int
    boost_clock_mhz: int
    peak_tflops: dict[str, float]  # keys from DTYPE_KEYS; 0.0 = not supported
    memory_gib: float
    memory_bw_gbps: float  # HBM/GDDR bandwidth, GB/s (1e9 bytes/s)
    l2_cache_mib: float
    pcie_gen: int
    pcie_lanes: int
    h2d_pinned_gbps: float  # typical measured host-to-device, pinned source
    h2d_pageable_gbps: float  # typical measured host-to-device, pageable source
    d2h_pinned_gbps: float
    nvlink_gbps: float  # per-GPU total NVLink bandwidth, one direction; 0.0 = none
    launch_overhead_us: float  # host-to-GPU launch latency of one kernel
    context_mib: float  # device memory the CUDA context + cuBLAS/cuDNN handles take before any tensor
    tdp_w: float = 0.0
    # What CUDA reports as the device's total memory (cudaMemGetInfo, get_device_properties().total_memory), in MiB;
    # below the marketing figure (ECC and driver reservations). 0.0 = not known: memory_gib is used.
    total_memory_mib: float = 0.0
    # Note [Sustained clock]: the SM clock the GPU holds under a sustained full training load, where that is below
    # boost_clock_mhz (0.0 = the boost clock); peaks scale with it. full_bandwidth_clock_mhz: the SM clock below
    # which device-memory bandwidth falls in proportion (0.0 = bandwidth does not depend on the SM clock).
    sustained_clock_mhz: float = 0.0
    full_bandwidth_clock_mhz: float = 0.0
    # Note [Half-rate tensor cores]: GeForce boards run 16-bit tensor ops with FP32 accumulation (what cuBLAS and
    # cuDNN use for fp16/bf16) and TF32 at half the rate the same SM reaches on its professional sibling; their
    # peak_tflops are those half rates, and a large GEMM reaches a larger share of them (gpemu.cost.model).
    half_rate_tensor: bool = False
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def memory_bytes(self) -> int:
        """Return the device memory CUDA reports in bytes (total_memory_mib when known, else memory_gib)."""
        if self.total_memory_mib > 0:
            return int(self.total_memory_mib * 1024**2)
        return int(self.memory_gib * 1024**3)

    def peak_flops(self, dtype: str) -> float:
        """Return peak FLOP/s for a dtype key ("fp32", "fp16", ...), falling back to fp32 where unsupported."""
        tflops = self.peak_tflops.get(dtype, 0.0) or self.peak_tflops["fp32"]
        return tflops * 1e12

    @property
    def memory_bw_bytes_per_s(self) -> float:
        """Device memory bandwidth in bytes/s."""
        return self.memory_bw_gbps * 1e9

    @property
    def load_clock_mhz(self) -> float:
        """Return the SM clock under a sustained full load: sustained_clock_mhz, else the boost clock (Note
        [Sustained clock])."""
        return self.sustained_clock_mhz or float(self.boost_clock_mhz)

    @property
    def load_clock_ratio(self) -> float:
        """Return load_clock_mhz / boost_clock_mhz: the fraction of the datasheet (boost) peaks reached under load."""
        return self.load_clock_mhz / self.boost_clock_mhz

    @property
    def load_memory_bw_gbps(self) -> float:
        """Return the device-memory bandwidth at load_clock_mhz: the datasheet figure, scaled down in proportion
        when the SM clock is below full_bandwidth_clock_mhz (Note [Sustained clock])."""
        if not self.full_bandwidth_clock_mhz:
            return self.memory_bw_gbps
        return self.memory_bw_gbps * min(1.0, self.load_clock_mhz / self.full_bandwidth_clock_mhz)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.cache
def _catalog() -> dict[str, GPUSpec]:
    text = resources.files("gpemu.hardware").joinpath("gpus.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    out: dict[str, GPUSpec] = {}
    for entry in data["gpu"]:
        entry = dict(entry)
        entry["aliases"] = tuple(entry.get("aliases", ()))
        entry["compute_capability"] = tuple(entry["compute_capability"])
        entry["peak_tflops"] = {k: float(entry["peak_tflops"].get(k, 0.0)) for k in DTYPE_KEYS}
        spec = GPUSpec(**entry)
        out[spec.key] = spec
    return out


@functools.cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for spec in _catalog().values():
        for name in (spec.key, spec.name, *spec.aliases):
            index.setdefault(_norm(name), spec.key)
    return index


def list_gpus() -> list[GPUSpec]:
    """Return every GPU in the catalog, in file order."""
    return list(_catalog().values())


def gpu_names() -> list[str]:
    """Return every accepted GPU name: keys, device names and aliases."""
    names: list[str] = []
    for spec in _catalog().values():
        names += [spec.key, spec.name, *spec.aliases]
    return names


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Return the spec for a key, alias, GPEmu folder name or torch device name; raise UnknownNameError otherwise."""
    if isinstance(name, GPUSpec):
        return name
    key = _alias_index().get(_norm(name))
    if key is None:
        raise UnknownNameError("gpu", name, [s.key for s in _catalog().values()] + gpu_names())
    return _catalog()[key]
