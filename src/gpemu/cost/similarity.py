"""How alike two GPUs are for timing: spec distance, SM generation, and the nearest measured GPU to borrow from."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpemu.hardware import GPUSpec, get_gpu

# Note [Choosing the source GPU]
# Scaling Y from a measured X (and borrowing X's fitted per-GPU factors for an unmeasured Y, Note [Borrowed
# factors] in predict.py) carries over everything the time model does not see: how well cuDNN's kernels for that SM
# design use it, achieved vs. datasheet clocks and bandwidth, cache sizes. Those follow the SM generation far more
# than the headline numbers, so sources are ranked by generation distance |cc(Y) - cc(X)| first and by spec distance
# only as a tie-break (weight SPEC_TIEBREAK). On GPEmu's five GPUs (bench/predict_validation.py, leave-one-GPU-out,
# fwd+bwd, 2026-11-22) ranking by spec distance picked the K80 for the M40 (52.5 % median error; the P100, one
# generation away, gives 10.9 %) and Turing for the P100 (23.7 %; Maxwell gives 11.7 %): the scaled path went from
# 18.0 / 51.8 % (median / p90) to 11.1 / 34.6 %. The K80 has no near neighbour in that data and stays at 34 %.
SPEC_TIEBREAK = 0.1


def spec_distance(a: GPUSpec, b: GPUSpec) -> float:
    """Return how different two GPUs' specs are (log-distance of fp32 peak and bandwidth, half that of SM count)."""
    d = abs(math.log(a.peak_tflops["fp32"] / b.peak_tflops["fp32"]))
    d += abs(math.log(a.memory_bw_gbps / b.memory_bw_gbps))
    return d + 0.5 * abs(math.log(a.sm_count / b.sm_count))


def arch_generation(spec: GPUSpec) -> float:
    """Return the compute capability as one number (7.5 for sm_75): the SM generation's place in NVIDIA's line."""
    major, minor = spec.compute_capability
    return major + minor / 10


def source_distance(target: GPUSpec, source: GPUSpec) -> float:
    """Return how poor a proxy `source`'s measurements are for `target` (see Note [Choosing the source GPU])."""
    gap = abs(arch_generation(target) - arch_generation(source))
    return gap + SPEC_TIEBREAK * spec_distance(target, source)


def nearest(target: GPUSpec, candidates: Iterable[str]) -> str | None:
    """Return the catalog key among `candidates` that is the best proxy for `target` (None when there are none)."""
    keys = [k for k in candidates if k != target.key]
    if not keys:
        return None
    return min(keys, key=lambda k: (source_distance(target, get_gpu(k)), k))
