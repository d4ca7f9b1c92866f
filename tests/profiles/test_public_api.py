"""Pins gpemu.profiles' public names (other packages import them)."""

from __future__ import annotations

import gpemu.profiles


def test_all_is_pinned() -> None:
    assert sorted(gpemu.profiles.__all__) == sorted(
        [
            "COLUMNS", "DTYPES", "KEY_COLUMNS", "PHASES", "TIME_PHASES", "GpemuWarning", "ImportReport", "ProfileDB",
            "builtin_profile_paths", "import_gpemu", "phase_unit", "predict_step", "read_gpemu_tree",
            "read_profile_csv", "rows_from_records", "user_profile_dir", "write_profile_csv",
        ]
    )  # fmt: skip
    for name in gpemu.profiles.__all__:
        assert hasattr(gpemu.profiles, name), name
