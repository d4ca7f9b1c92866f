"""gpemu.profiler: measures a real GPU into profile rows (the only code that needs CUDA); dry-runs on the CPU."""

from gpemu.profiler.campaign import campaign_passes, run_campaign
from gpemu.profiler.merge import MergeReport, merge_profiles
from gpemu.profiler.runner import ProfileConfig, Profiler, RunSummary, run_profile
from gpemu.profiler.sweep import GPEMU_VISION_MODELS, LANGUAGE_MODELS, parse_batch_sizes
from gpemu.profiler.validate import Validation, compare_runs, load_iterations

__all__ = [
    "GPEMU_VISION_MODELS",
    "LANGUAGE_MODELS",
    "MergeReport",
    "ProfileConfig",
    "Profiler",
    "RunSummary",
    "Validation",
    "campaign_passes",
    "compare_runs",
    "load_iterations",
    "merge_profiles",
    "parse_batch_sizes",
    "run_campaign",
    "run_profile",
]
