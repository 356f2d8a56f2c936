"""glibc malloc settings for tensor-sized blocks: freed memory is reused, not handed back.

A CPU train step or decode step allocates and frees the same large tensors again and again
(activations, gradients, a (rows, vocabulary) logits block). With glibc's defaults, blocks
above its mmap threshold (128 KiB, raised as blocks are freed, at most 32 MiB) are mapped
fresh from the kernel and unmapped when freed, so every such tensor pays a page fault per
4 KiB page each time it is written; a thread other than the main one allocates from an
arena of 64 MiB heaps that are shrunk (``MADV_DONTNEED``) as memory is freed, with the same
result. Measured on the SmolLM2-135M-Instruct example's bf16 GRPO stage (2 cores): about a
million page faults a train step with the defaults, a few hundred with the settings below,
and the step's median 7.40 s against 5.36 s (docs/performance.md, "glibc's allocator").

``tune()`` sets them in this process (``mallopt``): one arena for every thread, blocks below
1 GiB taken from the heap, and up to 1 GiB of freed heap kept for reuse. The arena limit
only holds if it is set before a second thread allocates, so the CLI calls ``tune()`` first
thing; Ray's worker processes get the same settings as environment variables at their start
(``env()``, through each actor's ``runtime_env``). The cost: memory freed after a peak stays
with the process (up to the trim threshold) instead of going back to the system.

``TRINITY_MALLOC=default`` keeps glibc's defaults; ``MALLOC_*`` variables a user set
(glibc's own tunables) are left as they are. Without glibc (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from typing import Dict

logger = logging.getLogger(__name__)

OPT_OUT_ENV = "TRINITY_MALLOC"  # "default": leave glibc's malloc settings alone
# mallopt parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_SETTINGS = (  # (mallopt parameter, environment variable glibc reads at start, value)
    (_M_ARENA_MAX, "MALLOC_ARENA_MAX", 1),
    (_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 1 << 30),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 1 << 30),
    (_M_TOP_PAD, "MALLOC_TOP_PAD_", 1 << 28),
)
_ENV = {name: str(value) for _, name, value in _SETTINGS}


def _wanted() -> bool:
    """glibc here, and the user neither opted out nor set glibc's own variables."""
    if os.environ.get(OPT_OUT_ENV, "").lower() == "default":
        return False
    if any(name in os.environ for name in _ENV):
        return False
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def env() -> Dict[str, str]:
    """The settings as glibc's environment variables, for a process about to start: wanted
    here, or this process was started with them (an actor starting actors passes them on);
    empty otherwise."""
    inherited = all(os.environ.get(name) == value for name, value in _ENV.items())
    return dict(_ENV) if inherited or _wanted() else {}


def tune() -> bool:
    """Apply the settings to this process; whether all were taken."""
    if not _wanted():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    taken = [libc.mallopt(param, value) == 1 for param, _, value in _SETTINGS]  # each tried
    if not all(taken):
        logger.debug("glibc refused some malloc settings: %s", _SETTINGS)
    return all(taken)
