"""What a stage's folder says before the stage runs: which weights it started from, whether it
already ran the steps asked for, and whether it is past them.

A stage after the first starts from the previous stage's final weights. Its folder records
which ones in ``start_weights.json``: the previous stage's folder, the step of its final
checkpoint and that checkpoint's random id (``checkpoint_id`` in its ``extra.json``), written
before the stage's roles start and never while they run, so a run killed at any point still
has it. When the previous stage ends with other weights since (the 2-step try of a staged
config, then the full run), the stage's checkpoints, buffer rows, task order and metrics all
come from the old weights: the folder is moved aside (``<folder>.old-<time>``) and the stage
starts fresh, with a line saying so. A folder without the record (written by an earlier
version) resumes as before.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

from trinity.common.weights import latest_step, step_dir
from trinity.runtime.failures import RunFailed
from trinity.trainer.checkpoint import CHECKPOINT_ID_KEY, EXTRA_FILE

START_FILE = "start_weights.json"
# Modes whose trainer resumes from the stage folder's checkpoints.
RESUMES = ("both", "colocate", "train", "serve")
# Modes whose run ends after its planned steps, so that "finished" means something.
FINISHES = ("both", "colocate", "train")


def handover_dir(job_dir: str, step: int) -> Optional[str]:
    """The folder the next stage starts from: checkpoint ``step``'s HF export (a LoRA stage's
    merged whole model when it wrote one); None when it has none."""
    path = os.path.join(step_dir(job_dir, step), "hf")
    merged = os.path.join(path, "merged")  # a LoRA stage's whole model (hf/: the adapter)
    if os.path.isdir(merged):
        return merged
    return path if os.path.isdir(path) else None


def weights_origin(job_dir: str) -> Optional[Dict[str, Any]]:
    """What identifies the final weights of the stage in ``job_dir`` (its newest checkpoint):
    the folder, the step and the checkpoint's id; None without a checkpoint."""
    step = latest_step(job_dir)
    if step is None:
        return None
    try:
        with open(os.path.join(step_dir(job_dir, step), EXTRA_FILE)) as f:
            checkpoint_id = json.load(f).get(CHECKPOINT_ID_KEY)
    except (OSError, ValueError):
        checkpoint_id = None
    return {"stage_dir": os.path.abspath(job_dir), "step": step, "checkpoint_id": checkpoint_id}


def same_weights(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two origins are one checkpoint: by id; by folder and step for a checkpoint of
    an earlier version, which has none."""
    if a.get("checkpoint_id") and b.get("checkpoint_id"):
        return a["checkpoint_id"] == b["checkpoint_id"]
    return (os.path.realpath(a["stage_dir"]), a["step"]) == (
        os.path.realpath(b["stage_dir"]),
        b["step"],
    )


def read_start(job_dir: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(job_dir, START_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_start(job_dir: str, origin: Dict[str, Any]) -> None:
    """Record ``origin`` as the weights the stage in ``job_dir`` starts from (by rename)."""
    os.makedirs(job_dir, exist_ok=True)
    path = os.path.join(job_dir, START_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(origin, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def describe(origin: Dict[str, Any]) -> str:
    return f"{os.path.basename(origin['stage_dir'])}'s step {origin['step']}"


def prepare_folder(
    config: Any, origin: Optional[Dict[str, Any]], say: Callable[[str], None]
) -> None:
    """Before stage ``config`` runs from the weights ``origin`` identifies (None: its own
    ``model_path``): move its folder aside when what it holds was trained from other weights
    (``say`` tells where), and record ``origin`` when the stage starts fresh."""
    job_dir = config.checkpoint_job_dir
    if origin is None or not config.continue_from_checkpoint or config.mode not in RESUMES:
        return
    recorded = read_start(job_dir)
    if recorded is None and latest_step(job_dir) is not None:
        return  # written by an earlier version: which weights it started from is unknown
    if recorded is not None and not same_weights(recorded, origin):
        refuse_move(config, recorded, origin)
        moved = move_aside(job_dir)
        previous, step = os.path.basename(origin["stage_dir"]), origin["step"]
        changed = (
            f"{previous} now ends at step {step}"
            if step != recorded["step"]
            else f"{previous} wrote its step {step} again since"
        )
        say(
            f"stage {config.name}: its folder was trained from {describe(recorded)}, and "
            f"{changed}: starting it fresh from those weights; the old folder is kept as {moved}"
        )
    if latest_step(job_dir) is None:
        write_start(job_dir, origin)


def refuse_move(config: Any, recorded: Dict[str, Any], origin: Dict[str, Any]) -> None:
    """Raise ``RunFailed`` when moving the stage's folder aside would not take its state with
    it: a trainer reading a separate explore run's store, or a buffer outside the folder."""
    from trinity.preflight.decoupled import reads_explorer_store

    storage = config.buffer.trainer_input.experience_buffer
    where = None
    if reads_explorer_store(config):
        where = "a separate explore run writes its experiences"
    elif config.mode != "train" and not inside(storage.path, config.checkpoint_job_dir):
        where = f"its experience buffer ({storage.path}) is outside its folder"
    if where is None:
        return
    raise RunFailed(
        f"stage {config.name}: its folder {config.checkpoint_job_dir} was trained from "
        f"{describe(recorded)}, and the previous stage now ends at {describe(origin)}; "
        f"{where}, so it cannot start fresh by itself: move the folder and that buffer's rows "
        "aside, or give the run another name (name=...)"
    )


def inside(path: Optional[str], job_dir: str) -> bool:
    """Whether a buffer ``path`` (a file, ``sqlite:///`` URL or other database URL; None: the
    default file in the folder) lies in ``job_dir``."""
    if path is None:
        return True
    path = path.removeprefix("sqlite:///")
    if "://" in path:
        return False
    folder = os.path.realpath(job_dir)
    return os.path.commonpath([os.path.realpath(path), folder]) == folder


def move_aside(job_dir: str) -> str:
    """Rename ``job_dir`` to ``<job_dir>.old-<date-time>`` (a free name); the new name."""
    base = f"{os.path.normpath(job_dir)}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    moved, n = base, 1
    while os.path.exists(moved):
        n += 1
        moved = f"{base}-{n}"
    os.rename(job_dir, moved)
    return moved


def progress(config: Any, steps: int) -> Tuple[Optional[int], Optional[str]]:
    """(the step of the newest checkpoint in the stage's folder, or None; its final weights
    when that step is the ``steps`` planned and they were exported, else None)."""
    done = latest_step(config.checkpoint_job_dir)
    if done is None or done != steps:
        return done, None
    return done, handover_dir(config.checkpoint_job_dir, done)


def finished_weights(config: Any, steps: int) -> Optional[str]:
    """The final weights of a stage whose folder already holds its ``steps`` (nothing left to
    run), else None. A folder past ``steps`` is a ``RunFailed`` saying what to do."""
    if not config.continue_from_checkpoint or config.mode not in FINISHES:
        return None
    done, final = progress(config, steps)
    if done is not None and done > steps:
        many = f"{steps} step" + ("s" if steps > 1 else "")
        raise RunFailed(
            f"stage {config.name}: the run in {config.checkpoint_job_dir} is already past step "
            f"{steps} (it stopped at step {done}); to run {many}, give it another folder "
            "(name=... or checkpoint_root_dir=...) or start a new run "
            f"(continue_from_checkpoint=false); to go on, ask for more than {done} steps "
            "(buffer.total_steps)"
        )
    return final
