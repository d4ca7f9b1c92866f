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


# Note [Blackwell RTX SM]
# Compute capability 12.x (sm_120: RTX 50 GeForce and RTX PRO Blackwell boards, GB202/GB203/...; sm_121: GB10) is
# numbered after datacenter Blackwell (10.x) but is not its superset: its tensor cores are driven by Ada's warp-level
# mma.sync (extended with block-scaled FP4/FP6/FP8 kinds: NVIDIA/cutlass issue 3227, mma.sync ... block_scale on
# sm_120a/121a), without Hopper's warpgroup MMA (wgmma needs the sm_90a target, whose "a" features do not carry to
# later devices: LLVM review D155851) or datacenter Blackwell's tcgen05 and tensor memory (sm_100a/101a/110a only:
# llvm/llvm-project PR 160464's tcgen05 tests). It keeps Ada's 128 KB of L1/shared memory per SM (Hopper and B200:
# 228 KB), GDDR memory and GeForce-style boost clocks. What Note [Choosing the source GPU] borrows (cuDNN's kernels
# for the SM design, achieved vs. datasheet clocks and bandwidth) is therefore Ada's, not B200's: for ranking sources
# sm_12x sits right after Ada (8.9 + (minor + 1) / 100: 8.91 for sm_120), so an RTX 5090 borrows from an RTX 4090
# (0.01 away) before an H100 (0.09) or a B200 (1.09), where the raw number 12.0 would have put the B200 first (2.0
# against the 4090's 3.1). The fused-attention efficiency follows the same split (Note [Fused attention efficiency]
# in model.py).
def arch_generation(spec: GPUSpec) -> float:
    """Return the SM generation's place in NVIDIA's line as one number: the compute capability (7.5 for sm_75),
    except sm_12x, placed right after Ada (Note [Blackwell RTX SM])."""
    major, minor = spec.compute_capability
    if major == 12:
        return 8.9 + (minor + 1) / 100
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
