"""Where child processes' output goes: ``output_to`` points this process's stdout and stderr
file descriptors at a file for a while, and every process started meanwhile keeps writing
there (they inherit the descriptors), while this process writes to its console again after.
Used for libraries that start processes of their own and print freely (vLLM's engine)."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator, Optional


@contextmanager
def output_to(path: str) -> Iterator[None]:
    """stdout and stderr (file descriptors 1 and 2) append to ``path`` while inside."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (target, *saved):
            os.close(fd)


def log_folder() -> Optional[str]:
    """The folder of the file this process logs to (a ``FileHandler`` on the root logger, or
    one of a handler's ``files``, as a process that hosts several roles has), if any."""
    for handler in logging.getLogger().handlers:
        files = getattr(handler, "files", {})
        for h in [handler, *files.values()]:
            if isinstance(h, logging.FileHandler):
                return os.path.dirname(h.baseFilename)
    return None
