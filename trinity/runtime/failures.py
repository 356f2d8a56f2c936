"""How a stage's failure reads on the console: the role, its own error, and its log file."""

from __future__ import annotations

import glob
import os
import sys
from typing import Any


class RunFailed(RuntimeError):
    """A component of a stage failed; the message names it and where its log is."""


def failure_message(exc: Exception, role: str, config: Any) -> str:
    """One readable message for a role's failure: its own error text, and where its log is."""
    ray = sys.modules.get("ray")  # a stage run in-process raises no Ray errors
    ray_error = ray.exceptions.RayError if ray is not None else ()
    cause = exc
    # A role's error may have crossed several actors; each hop wraps it once more.
    while isinstance(cause, ray_error) and getattr(cause, "cause", None):
        if cause.cause is cause:
            break
        cause = cause.cause
    if isinstance(cause, ray_error):  # no Python error inside: an actor died
        text = f"{type(cause).__name__}: {_last_line(str(cause))}"
    else:
        text = f"{type(cause).__name__}: {cause}"
    name = config.trainer.name if role == "trainer" else config.explorer.name
    if role.startswith("trainer rank "):
        from trinity.runtime.trainer_ranks import rank_name

        name = rank_name(config, int(role.rsplit(" ", 1)[1]))
    log = log_file(config, name)
    return (
        f"stage '{config.name}': the {role} failed: {text}\n"
        f"full log: {log}\noutputs written so far are kept in {config.checkpoint_job_dir}"
    )


def log_file(config: Any, name: str) -> str:
    """Where actor ``name`` of a stage logs: ``log/<name>.log``, or with
    ``log.group_by_node`` the newest ``log/<node ip>/<name>.log`` (the job dir is on a
    filesystem every node shares; when none is found there, the path with a placeholder)."""
    root = os.path.join(config.checkpoint_job_dir, "log")
    if not config.log.group_by_node:
        return os.path.join(root, f"{name}.log")
    found = glob.glob(os.path.join(glob.escape(root), "*", f"{glob.escape(name)}.log"))
    if found:
        return max(found, key=os.path.getmtime)
    return os.path.join(root, "<node ip>", f"{name}.log")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
