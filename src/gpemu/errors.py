"""User-facing errors: each names the bad input and, where it can, the nearest valid choices."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GpemuError(Exception):
    """Base class for errors that are the user's input, not a bug (the CLI prints them without a traceback)."""


_LISTED_BY_CLI = frozenset({"gpu", "model"})  # `gpemu gpus`, `gpemu models`


class UnknownNameError(GpemuError, KeyError):
    """An unknown GPU, model, phase or dtype name."""

    def __init__(self, what: str, name: str, choices: Iterable[str]) -> None:
        self.what = what
        self.name = name
        self.choices = sorted(set(choices))
        close = closest(name, self.choices)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if what in _LISTED_BY_CLI:  # long lists have a command; short ones are spelled out
            full = f"see the full list with `gpemu {what}s`"
        else:
            full = f"one of {', '.join(self.choices)}"
        super().__init__(f"unknown {what} {name!r}{hint} ({full})")

    def __str__(self) -> str:
        return str(self.args[0])


class ProfileFormatError(GpemuError, ValueError):
    """A malformed profile file; the message names the file and line."""

    def __init__(self, path: object, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")


class GpemuWarning(UserWarning):
    """A figure gpemu had to guess, or an emulation that is less faithful than asked (the run goes on)."""


class UnsupportedOpError(GpemuError, NotImplementedError):
    """An operator the emulator cannot handle; the message names the op and the workaround."""


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to `n` choices closest to `name` (case-insensitive), best first."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    subs = [c for c in choices if name.lower() in c.lower() and lowered.get(c.lower()) not in hits]
    out = [lowered[h] for h in hits] + subs
    return out[:n]
