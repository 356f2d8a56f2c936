"""Checkpoints in ``<job_dir>/global_step_N/`` and veRL's ``latest_checkpointed_iteration.txt``.

A checkpoint holds ``actor/model.pt`` (weights), ``actor/optim.pt`` (optimizer and lr
scheduler), ``extra.json`` (step, sample-strategy state) and, when asked, ``hf/`` (a folder
``AutoModelForCausalLM.from_pretrained`` loads, written by the trainer). The "latest"
marker is written last, by
rename, so a run killed mid-save resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional

import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"


def step_dir(job_dir: str, step: int) -> str:
    return os.path.join(job_dir, f"global_step_{step}")


def latest_step(job_dir: str) -> Optional[int]:
    """The step of the newest complete checkpoint, or None."""
    path = os.path.join(job_dir, LATEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    return int(text) if text.isdigit() else None


def _saved_steps(job_dir: str) -> List[int]:
    if not os.path.isdir(job_dir):
        return []
    found = (re.fullmatch(r"global_step_(\d+)", d) for d in os.listdir(job_dir))
    return sorted(int(m.group(1)) for m in found if m)


def save_checkpoint(
    job_dir: str,
    step: int,
    model: torch.nn.Module,
    optim_state: Dict[str, Any],
    extra: Dict[str, Any],
    max_to_keep: Optional[int] = None,
    states: Optional[Dict[str, Any]] = None,
) -> str:
    """Write checkpoint ``step`` and mark it the latest; keep the newest ``max_to_keep``.

    ``states`` holds further named states (e.g. ``critic``), each saved as ``<name>.pt``.
    """
    out = step_dir(job_dir, step)
    os.makedirs(os.path.join(out, "actor"), exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out, "actor", "model.pt"))
    torch.save(optim_state, os.path.join(out, "actor", "optim.pt"))
    for name, state in (states or {}).items():
        torch.save(state, os.path.join(out, f"{name}.pt"))
    with open(os.path.join(out, "extra.json"), "w") as f:
        json.dump({"step": step, **extra}, f)
    tmp = os.path.join(job_dir, LATEST_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(job_dir, LATEST_FILE))
    if max_to_keep:
        for old in _saved_steps(job_dir)[:-max_to_keep]:
            shutil.rmtree(step_dir(job_dir, old), ignore_errors=True)
    return out


def load_checkpoint(job_dir: str, step: int) -> Dict[str, Any]:
    """``{"model", "optim", "extra", "states"}`` of checkpoint ``step``."""
    src = step_dir(job_dir, step)
    with open(os.path.join(src, "extra.json")) as f:
        extra = json.load(f)
    states = {
        name[: -len(".pt")]: torch.load(
            os.path.join(src, name), map_location="cpu", weights_only=False
        )
        for name in os.listdir(src)
        if name.endswith(".pt")
    }
    return {
        "states": states,
        "model": torch.load(
            os.path.join(src, "actor", "model.pt"), map_location="cpu", weights_only=True
        ),
        "optim": torch.load(
            os.path.join(src, "actor", "optim.pt"), map_location="cpu", weights_only=False
        ),
        "extra": extra,
    }


def weights_path(job_dir: str, step: int) -> str:
    return os.path.join(step_dir(job_dir, step), "actor", "model.pt")
