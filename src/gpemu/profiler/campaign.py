"""The GPU measurement campaign: the GPEmu model set plus BERT-base and GPT-2, in prioritised, resumable passes.

Run on a CUDA machine (each call resumes where the last stopped, so it fits 10-minute command limits):
    python -m gpemu.profiler.campaign --out profiles-h100 --budget-s 540
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from gpemu.errors import UnknownNameError
from gpemu.profiler.runner import ProfileConfig, Profiler, RunSummary
from gpemu.profiler.sweep import GPEMU_VISION_MODELS, LANGUAGE_MODELS

PLANS: tuple[str, ...] = ("full", "lease")


@dataclass(frozen=True)
class Pass:
    """One sweep of the campaign: models x dtypes x batch sizes, and at which batch sizes to record per-op times."""

    name: str
    models: tuple[str, ...]
    dtypes: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    op_batch_sizes: tuple[int, ...] = ()


# Note [Lease plan]
# A lent GPU comes for about 15 minutes a session, start included, so the "lease" plan orders the work by what one
# short run is worth: a core of GPEmu models that ../shared/data also measured (their scaled-from-nearest prediction
# can be checked) plus five it never measured (ViT, ConvNeXt, Swin, EfficientNet, RegNet: the spec and per-op path),
# at the batch sizes where the GPU is busy, both dtypes, per-op times at batch 64; then the language models; then
# batch 1 (the host-bound floor); then the rest of the GPEmu set; then the gaps.
LEASE_CORE_VISION: tuple[str, ...] = (
    "resnet50", "resnet18", "resnet152", "vgg16", "densenet121", "mobilenet_v2", "inception_v3",
    "resnext50_32x4d", "squeezenet1_1", "shufflenet_v2_x1_0", "alexnet", "wide_resnet50_2", "mnasnet1_0",
    "vit_b_16", "convnext_tiny", "swin_t", "efficientnet_b0", "regnet_y_1_6gf",
)  # fmt: skip


def lease_passes(max_batch: int = 512) -> list[Pass]:
    """Return the passes of the lease plan (Note [Lease plan]): most valuable first, for a short GPU lease."""
    core, lms = LEASE_CORE_VISION, LANGUAGE_MODELS
    rest = tuple(m for m in GPEMU_VISION_MODELS if m not in core)
    passes = [
        Pass("core", core, ("fp32", "amp"), (16, 64, 256), (64,)),
        Pass("lm", lms, ("fp32", "amp"), (4, 16), (16,)),
        Pass("host-floor", core, ("fp32", "amp"), (1,)),
        Pass("rest", rest, ("fp32", "amp"), (64, 256)),
        Pass("core-fill", core, ("fp32", "amp"), (4, 32, 128)),
        Pass("lm-fill", lms, ("fp32", "amp"), (1, 8, 32)),
    ]
    big = tuple(b for b in (512,) if b <= max_batch)
    if big:
        passes.append(Pass("large", core, ("fp32", "amp"), big))
    return passes


def campaign_passes(max_batch: int = 512, dry_run: bool = False, plan: str = "full") -> list[Pass]:
    """Return the passes in priority order: a coarse grid of everything first, then the gaps, then batch 512.

    Interpolation in batch size is linear, so coverage of every model at a few batch sizes is worth more than a
    complete sweep of a few models; each later pass fills in between.
    """
    vision, lms = GPEMU_VISION_MODELS, LANGUAGE_MODELS
    if plan not in PLANS:
        raise UnknownNameError("campaign plan", plan, PLANS)
    if plan == "lease" and not dry_run:
        return lease_passes(max_batch)
    if dry_run:  # tiny stand-ins, tiny batches: exercises the same loops in seconds
        return [
            Pass("coarse-fp32", ("tiny-cnn", "tiny-mlp"), ("fp32",), (1, 4), (4,)),
            Pass("coarse-amp", ("tiny-cnn",), ("amp",), (1, 4)),
            Pass("fill", ("tiny-cnn", "tiny-mlp"), ("fp32",), (2,)),
        ]
    coarse = (1, 16, 64, 256)
    fill = (2, 4, 8, 32, 128)
    passes = [
        Pass("coarse-fp32", vision, ("fp32",), coarse, (16, 256)),
        Pass("coarse-amp", vision, ("amp",), coarse, (16, 256)),
        Pass("lm-coarse", lms, ("fp32", "amp"), (1, 4, 16), (4,)),
        Pass("fill-fp32", vision, ("fp32",), fill),
        Pass("fill-amp", vision, ("amp",), fill),
        Pass("lm-fill", lms, ("fp32", "amp"), (2, 8, 32)),
    ]
    big = tuple(b for b in (512,) if b <= max_batch)
    if big:
        passes.append(Pass("large", vision, ("fp32", "amp"), big))
    return passes


def run_campaign(
    out_dir: Path,
    budget_s: float | None = None,
    gpu_index: int = 0,
    warmup: int = 5,
    reps: int = 20,
    max_batch: int = 512,
    dry_run: bool = False,
    show_progress: bool = True,
    plan: str = "full",
) -> list[tuple[Pass, RunSummary]]:
    """Run the passes in order until done or `budget_s` is spent; return each pass's summary."""
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    results: list[tuple[Pass, RunSummary]] = []
    first = True
    for p in campaign_passes(max_batch, dry_run, plan):
        config = ProfileConfig(
            models=list(p.models),
            batch_sizes=list(p.batch_sizes),
            dtypes=list(p.dtypes),
            out_dir=out_dir,
            gpu_index=gpu_index,
            warmup=warmup,
            reps=reps,
            dry_run=dry_run,
            op_batch_sizes=set(p.op_batch_sizes),
            ops=bool(p.op_batch_sizes),
            transfers=True,
            deadline_s=deadline,
            keep_going=True,
        )
        if not first:  # the bandwidth curve is measured by the first pass only
            config.bandwidth_sizes_bytes = (4096,)
        first = False
        summary = Profiler(config).run(show_progress=show_progress)
        results.append((p, summary))
        if summary.stopped_at_deadline:
            break
    return results


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m gpemu.profiler.campaign", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory (resumed if it exists)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new configuration after this")
    parser.add_argument("--gpu-index", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--plan", choices=PLANS, default="full", help="full: the GPEmu set in passes; lease: the "
                        "most valuable configurations first, for a short GPU lease (Note [Lease plan])")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny models, fake timing (CI)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    results = run_campaign(args.out, args.budget_s, args.gpu_index, args.warmup, args.reps, args.max_batch,
                           args.dry_run, show_progress=not args.no_progress, plan=args.plan)  # fmt: skip
    for p, s in results:
        print(f"{p.name}: done {len(s.done)}, resumed {len(s.resumed)}, oom {len(s.oom)}, "
              f"skipped-after-oom {len(s.skipped_after_oom)}" + (" [budget spent]" if s.stopped_at_deadline else ""))  # fmt: skip
        for model, why in s.failed:
            print(f"  failed {model}: {why}")
    complete = len(results) == len(campaign_passes(args.max_batch, args.dry_run, args.plan)) and not (
        results and results[-1][1].stopped_at_deadline
    )
    print("campaign complete" if complete else "campaign incomplete: run the same command again to resume")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
