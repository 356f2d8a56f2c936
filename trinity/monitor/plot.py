"""One PNG per run: reward, evaluations and losses against step, from the JSON-lines metrics.

``plot_run(job_dir)`` writes ``<job_dir>/monitor/plots.png`` next to the metrics it reads; a
panel appears only when the run logged its metrics (an SFT stage has a loss and nothing
else). ``trinity run`` calls it after each stage; ``trinity plot RUN_DIR`` on demand.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from trinity.monitor.monitor import read_metrics

Series = Dict[str, List[Tuple[int, float]]]

# panel title -> (metrics file, which keys): the first file that has any of them wins
PANELS: List[Tuple[str, str, re.Pattern]] = [
    ("training reward", "explorer", re.compile(r"rollout/reward/mean$")),
    ("training reward", "trainer", re.compile(r"critic/rewards/mean$")),
    ("evaluation", "explorer", re.compile(r"eval/.+/(accuracy|reward)/mean$")),
    ("losses", "trainer", re.compile(r"(actor|critic)/\w*_loss$")),
]


def series(records: List[dict], pattern: re.Pattern) -> Series:
    """Every finite numeric metric matching ``pattern``, as (step, value) in step order."""
    found: Series = {}
    for record in records:
        for key, value in record.items():
            if pattern.search(key) and isinstance(value, (int, float)) and value == value:
                found.setdefault(key, []).append((record["step"], float(value)))
    return {k: sorted(v) for k, v in found.items()}


def panels(job_dir: str) -> List[Tuple[str, Series]]:
    """(title, series) of each panel that has data, in ``PANELS`` order."""
    records = {
        role: read_metrics(os.path.join(job_dir, "monitor", f"{role}.jsonl"))
        for role in ("explorer", "trainer")
    }
    out: List[Tuple[str, Series]] = []
    for title, role, pattern in PANELS:
        if any(t == title for t, _ in out):
            continue
        found = series(records[role], pattern)
        if found:
            out.append((title, found))
    return out


def plot_run(job_dir: str, path: Optional[str] = None) -> Optional[str]:
    """Write the run's PNG (default ``<job_dir>/monitor/plots.png``); None if it logged nothing."""
    shown = panels(job_dir)
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 3 * len(shown)), squeeze=False)
    for ax, (title, found) in zip(axes[:, 0], shown, strict=True):
        for key, points in sorted(found.items()):
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, ms=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(os.path.basename(os.path.normpath(job_dir)))
    fig.tight_layout()
    path = path or os.path.join(job_dir, "monitor", "plots.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def job_dirs(root: str) -> List[str]:
    """``root`` if it is a run's job dir (holds ``monitor/``), else the job dirs just below
    it (a project folder, or the stages of a multi-stage run)."""
    if os.path.isdir(os.path.join(root, "monitor")):
        return [root]
    below = sorted(os.path.join(root, d) for d in os.listdir(root)) if os.path.isdir(root) else []
    return [d for d in below if os.path.isdir(os.path.join(d, "monitor"))]
