"""Handing OpenMP worker threads back when a role of a one-process stage goes idle.

On Linux torch runs its CPU ops' parallel regions on libgomp. Each thread that starts a
parallel region gets a pool of worker threads of its own, and the pool outlives the region.
libgomp counts the workers of every pool in the process. Once they outnumber the cores, each
barrier spins about 100 times instead of about 300,000 before it sleeps (its "throttled" spin
count). Then each of the thousands of small parallel regions of a train step pays a futex
wake-up.

A stage in one process (``runtime/local_stage.py``) holds the trainer's thread and the rollout
engine's thread, each with a pool: 3 threads counted on a 2-core machine, for the whole run.
Measured on the quickstart's model (2 cores): a train step beside an idle thread that had run
torch on 2 threads took 0.29 to 0.51 s, against 0.18 to 0.21 s alone.

``release_workers()`` calls ``omp_pause_resource_all(omp_pause_soft)`` (OpenMP 5.0), which
frees the calling thread's pool. Each compute role calls it when it hands the cores over: the
trainer after each step, the engine after each batch. The next parallel region starts new
workers, which start cold: in two A/B runs of 60 SFT steps, a release after each step took
0.389 and 0.408 s a step against 0.380 and 0.384 s without (within this machine's noise, but
not shown to be free). So it frees anything only while ``share_cores(True)`` is in force,
which ``local_stage`` sets for a stage whose trainer and engines take turns in this process.
Where no OpenMP runtime is loaded (macOS wheels, or a build without OpenMP), it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import Callable, Tuple

logger = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free threads, keep what a restart needs
_RUNTIMES = ("libgomp", "libiomp", "libomp")  # GNU, Intel and LLVM OpenMP


_shared = False  # whether this process's compute roles take turns on its cores


def share_cores(shared: bool) -> None:
    """Whether roles of this process take turns on the cores (a `both` stage in one process):
    only then does ``release_workers`` free anything."""
    global _shared
    _shared = shared


@functools.cache
def _pauses() -> Tuple[Callable[[int], int], ...]:
    """``omp_pause_resource_all`` of each OpenMP runtime this process has loaded (torch's,
    and any other a library bundles: each runtime counts only its own pools). Looked up once,
    by the first caller, which has run torch: its runtime is loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux
        return ()
    found = []
    for path in sorted(paths):
        if os.path.basename(path).startswith(_RUNTIMES):
            pause = getattr(ctypes.CDLL(path), "omp_pause_resource_all", None)
            if pause is not None:
                pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
                found.append(pause)
    return tuple(found)


def release_workers() -> None:
    """Free the OpenMP worker threads this thread's parallel regions started (see the module
    docstring), while ``share_cores(True)`` is in force; its next parallel region starts new
    ones."""
    if not _shared:
        return
    for pause in _pauses():
        if pause(OMP_PAUSE_SOFT) != 0:
            # called inside a parallel region, or a runtime that cannot pause: harmless
            logger.debug("omp_pause_resource_all refused; OpenMP workers kept")
