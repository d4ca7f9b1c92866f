"""The profile database: measured and imported rows, lookup with interpolation and flagged extrapolation."""

from gpemu.profiles.schema import COLUMNS, DTYPES, PHASES, TIME_PHASES

__all__ = ["COLUMNS", "DTYPES", "PHASES", "TIME_PHASES"]
