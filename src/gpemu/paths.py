"""Where gpemu keeps files it can rebuild: the cache directory ($GPEMU_CACHE_DIR, else the user cache dir)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "GPEMU_CACHE_DIR"


def cache_dir() -> Path:
    """Return the cache directory: $GPEMU_CACHE_DIR, else platformdirs' user cache dir for gpemu."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpemu"))
