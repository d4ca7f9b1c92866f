"""The profile database: measured and imported rows, lookup with interpolation and flagged extrapolation."""

from gpemu.profiles.db import GpemuWarning, ProfileDB, builtin_profile_paths, phase_unit, user_profile_dir
from gpemu.profiles.importer import ImportReport, import_gpemu, read_gpemu_tree
from gpemu.profiles.native import KEY_COLUMNS, read_profile_csv, rows_from_records, write_profile_csv
from gpemu.profiles.schema import COLUMNS, DTYPES, PHASES, TIME_PHASES
from gpemu.profiles.step import predict_step

__all__ = [
    "COLUMNS",
    "DTYPES",
    "KEY_COLUMNS",
    "PHASES",
    "TIME_PHASES",
    "GpemuWarning",
    "ImportReport",
    "ProfileDB",
    "builtin_profile_paths",
    "import_gpemu",
    "phase_unit",
    "predict_step",
    "read_gpemu_tree",
    "read_profile_csv",
    "rows_from_records",
    "user_profile_dir",
    "write_profile_csv",
]
