"""What ``trinity run`` says when it is stopped (Ctrl-C): where the stage was, what is kept,
and how to go on.

A stopped run keeps its checkpoints (written under a temporary name and renamed when whole)
and every experience it wrote; the same command resumes from the last checkpoint
(``continue_from_checkpoint``), training again the steps after it (README, "Stopping and
resuming").
"""

from __future__ import annotations

import os
from typing import Any, Optional

from trinity.common.weights import latest_step, step_dir
from trinity.monitor import read_metrics


class RunInterrupted(Exception):
    """The run was stopped by the user; the message says what was kept and how to go on."""


def _last_step(job_dir: str, role: str) -> Optional[int]:
    records = read_metrics(os.path.join(job_dir, "monitor", f"{role}.jsonl"))
    return int(records[-1]["step"]) if records else None


def _where(stage: Any) -> str:
    """'train step N' (the trainer's last finished step), or the explorer's for a stage
    without a trainer; 'step 0' before any finished."""
    job_dir = stage.checkpoint_job_dir
    explores = stage.mode in ("explore", "bench")
    role, what = ("explorer", "explore") if explores else ("trainer", "train")
    return f"{what} step {_last_step(job_dir, role) or 0}"


def stopped_message(stage: Any, root_name: str, resumes: bool, several: bool) -> str:
    """The lines printed for a run stopped while ``stage`` ran.

    ``root_name``: the run's ``name`` (what ``name=`` must say to resume a run that
    ``continue_from_checkpoint: false`` renamed); ``resumes``: that key's value;
    ``several``: the config has stages, so the stage is named.
    """
    job_dir = stage.checkpoint_job_dir
    of_stage = f" of stage {stage.name}" if several else ""
    first = f"stopped at {_where(stage)}{of_stage}"
    saved = latest_step(job_dir)
    if saved is None:
        kept = "no checkpoint was saved yet (the stage starts over from step 0)"
    else:
        kept = f"the last checkpoint is step {saved} ({step_dir(job_dir, saved)})"
    if resumes:
        how = "run the same command to go on"
    else:
        how = f"to go on, run the same command with continue_from_checkpoint=true name={root_name}"
    return f"{first}; {kept}; {how}"
