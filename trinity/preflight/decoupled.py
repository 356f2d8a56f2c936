"""Decoupled runs: an ``explore`` run and a ``train`` run started separately, sharing an
experience store (a ``queue``/``sql`` buffer: a kind that ``holds_experiences``) and the job
dir's checkpoints.

Both sides find the same store and job dir from the same ``checkpoint_root_dir``,
``project`` and ``name`` (the store is ``<job_dir>/buffer/<buffer name>.db`` unless the
buffer's ``path`` names one), so one YAML serves both: ``trinity run --config x.yaml
mode=explore`` and ``... mode=train``. Each side saves its resolved config as
``<mode>_config.yaml`` so neither overwrites the other's.
"""

from __future__ import annotations

from typing import Any, List

from trinity.buffer.storages import storage_kind


def reads_explorer_store(config: Any) -> bool:
    """A ``train`` run that trains on what a separate ``explore`` run writes to the store
    (an experience buffer whose kind holds experiences: ``storages.py``)."""
    storage = config.buffer.trainer_input.experience_buffer
    if config.mode != "train" or storage is None:
        return False
    return storage_kind(storage).holds_experiences


def resolved_config_name(config: Any) -> str:
    """The file in the job dir the run's resolved config is saved to: ``config.yaml``,
    except for a run that shares its job dir with another mode's run."""
    shares = config.mode in ("explore", "bench") or reads_explorer_store(config)
    return f"{config.mode}_config.yaml" if shares else "config.yaml"


def decoupled_problems(config: Any) -> List[str]:
    """What a ``train`` run reading an explorer's store needs."""
    if not reads_explorer_store(config):
        return []
    storage_type = config.buffer.trainer_input.experience_buffer.storage_type
    if config.buffer.total_steps is None and not config.buffer.explorer_input.tasksets:
        return [
            "buffer.total_steps is required in mode train with buffer.trainer_input."
            f"experience_buffer.storage_type = {storage_type} (or give the explorer's "
            "buffer.explorer_input.taskset, to count the steps as the explorer does)"
        ]
    return []
