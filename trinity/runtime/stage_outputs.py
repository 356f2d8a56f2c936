"""What a stage leaves besides its checkpoints: Ray's timeline, the plot, and where its final
HF export is. Extending: a new artifact of a finished stage is a function here, called from
``launcher.py``."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from trinity.common.weights import latest_step, step_dir


def export_timeline(path: str, runs: int, timeout: float = 5.0) -> None:
    """Ray's timeline as ``path``, once it holds the ``runs`` finished ``run`` calls of the
    stage's roles (or after ``timeout`` s). Actors report their calls to Ray about once a
    second, and what a killed actor had not reported is lost: so before the actors stop."""
    import ray

    deadline = time.monotonic() + timeout
    events = ray.timeline()
    while sum(e["ph"] == "X" and e["name"] == "run" for e in events) < runs:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
        events = ray.timeline()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(events, f)


def final_export(job_dir: str) -> Optional[str]:
    """The HF export of the newest checkpoint in ``job_dir``, if it has one."""
    step = latest_step(job_dir)
    if step is None:
        return None
    hf = os.path.join(step_dir(job_dir, step), "hf")
    return hf if os.path.isdir(hf) else None


def plot_stage(job_dir: str) -> None:
    """``monitor/plots.png`` of a finished stage; a plot that fails costs a warning, not the run."""
    from trinity.monitor.plot import plot_run

    try:
        plot_run(job_dir)
    except Exception as exc:  # matplotlib, a half-written metrics file: the run itself is done
        print(f"warning: no plot for {job_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
