"""The one "did you mean" every misspelled key, name or option gets."""

from __future__ import annotations

import difflib
from typing import Any, Iterable


def did_you_mean(name: Any, choices: Iterable[Any]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to ``name``, or ``""`` when none is
    close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
