"""Garbage collection paused while a run starts, and the startup's objects kept out of it.

A run's start creates a few million long-lived objects (torch, transformers, the config's
pydantic models, the checks' rows), and Python's cyclic collector rescans all of them at
every full collection: on the quickstart, seven full collections cost 0.7 s before the first
step. Paused while the run imports and checks, then frozen (``gc.freeze``, as the Python
docs suggest for objects that live as long as the process), they are never rescanned; the
collector runs as usual on everything made after.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator


@contextlib.contextmanager
def paused_until_started() -> Iterator[Callable[[], None]]:
    """Collector off inside; calling the yielded function freezes what exists and turns it
    back on. On leaving, frozen objects rejoin the collector (a process that runs again, such
    as a test session, gets them collected)."""
    enabled = gc.isenabled()
    gc.collect()  # cheap in a fresh CLI; in a process that runs again, the last run's garbage
    gc.disable()

    def started() -> None:
        gc.freeze()
        if enabled:
            gc.enable()

    try:
        yield started
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
