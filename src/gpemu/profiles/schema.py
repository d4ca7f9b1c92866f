"""The tidy profile-row schema shared by the database, the importer and the profiler."""

from __future__ import annotations

# One row = one figure for (gpu, workload, phase, batch_size, dtype).
#   gpu:        catalog key (gpemu.hardware), e.g. "v100-pcie-32gb"
#   workload:   model name, e.g. "resnet50" (torchvision names; "bert-base", "gpt2", or a user's name)
#   phase:      one of PHASES
#   batch_size: int >= 1 (0 for batch-independent rows such as model_h2d)
#   dtype:      one of DTYPES ("amp" = torch.autocast fp16/bf16 mixed precision with fp32 master weights)
#   value/unit: seconds ("s") for times, "MiB" for memory, "GB/s" for bandwidth rows
#   measured:   1 = measured on a real GPU, 0 = filled/extrapolated by whoever produced the file
#   source:     free text provenance (file it came from, tool, GPU driver/CUDA/torch versions, date)
COLUMNS: tuple[str, ...] = ("gpu", "workload", "phase", "batch_size", "dtype", "value", "unit", "measured", "source")

# "backward" follows GPEmu: loss + zero_grad + backward + optimizer.step. When "optimizer" is measured separately,
# "backward_only" holds backward alone and "backward" stays the GPEmu-compatible sum.
PHASES: tuple[str, ...] = (
    "forward",
    "backward",
    "backward_only",
    "optimizer",
    "h2d_pageable",
    "h2d_pinned",
    "d2h_pageable",
    "d2h_pinned",
    "model_h2d",
    "mem_peak",
    "mem_persistent",
    "mem_reserved",
)
TIME_PHASES: tuple[str, ...] = ("forward", "backward", "backward_only", "optimizer")
DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "amp", "amp_bf16")
