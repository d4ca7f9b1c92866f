"""Parsing human-written quantities (memory sizes) into base units."""

from __future__ import annotations

import re

from gpemu.errors import GpemuError

_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str) -> int:
    """Return a byte count from '10GiB', '512MiB', '8e9', '16 GB' (decimal and binary units)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise GpemuError(f"cannot parse memory size {text!r}: use e.g. 10GiB, 512MiB, 16GB or a byte count")
    size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise GpemuError(f"memory size must be positive, got {text!r}")
    return size
