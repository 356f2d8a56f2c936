"""Checks of ``storage_type: reasoning_gym`` tasksets that need the whole config.

What one taskset's ``reasoning_gym`` key names (known datasets, arguments their configs take,
the package installed) is checked when its rows are generated before start
(``ReasoningGymStorage.load``). Here: the key is read only by that storage type; the reward
that scores reasoning-gym's rows gets them; and a held-out taskset draws other rows than the
training tasksets (reasoning-gym draws row i from ``Random(seed + i)``, so seeds 42 and 43
share all rows but one: held-out sets need seed ranges apart, not just other seeds).
"""

from __future__ import annotations

import importlib.util
from typing import Any, List, Optional, Sequence, Tuple

from trinity.common.config.config import Config
from trinity.common.reasoning_gym import ReasoningGymError, seed_ranges
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.rewards.reasoning_gym import ReasoningGymReward
from trinity.common.workflows import WORKFLOWS
from trinity.preflight.components import origin_of

STORAGE_TYPE = "reasoning_gym"


def reasoning_gym_problems(config: Config, storages: Sequence[Tuple[str, Any]]) -> List[str]:
    """Every problem of this module's checks (module docstring)."""
    problems = [
        f"{path}.reasoning_gym is read only with storage_type reasoning_gym "
        f"({path}.storage_type is {storage.storage_type}): set it, or remove reasoning_gym"
        for path, storage in storages
        if storage.reasoning_gym is not None and storage.storage_type != STORAGE_TYPE
    ]
    if config.mode not in ("both", "colocate", "explore", "bench"):
        return problems
    return problems + _reward_row_problems(config) + _overlap_problems(config)


def _tasksets(config: Config, eval_sets: bool) -> List[Tuple[str, Any]]:
    explorer_input = config.buffer.explorer_input
    kind = "eval_tasksets" if eval_sets else "tasksets"
    found = explorer_input.eval_tasksets if eval_sets else explorer_input.tasksets
    return [(f"buffer.explorer_input.{kind}[{i}]", s) for i, s in enumerate(found)]


def _reward_name(storage: Any) -> Optional[str]:
    """The reward a taskset's workflow scores with, where both resolve."""
    if storage.default_reward_fn_type:
        return storage.default_reward_fn_type
    try:
        workflow = WORKFLOWS.get(storage.default_workflow_type or "")
    except KeyError:
        return None  # said by the component checks
    return getattr(workflow, "default_reward_fn", None)


def _reward_row_problems(config: Config) -> List[str]:
    """``reasoning_gym_reward`` scores the rows of a reasoning_gym taskset only."""
    problems = []
    for path, storage in _tasksets(config, False) + _tasksets(config, True):
        name = _reward_name(storage)
        if not name or storage.storage_type == STORAGE_TYPE or name not in REWARD_FUNCTIONS:
            continue
        if not issubclass(REWARD_FUNCTIONS.get(name), ReasoningGymReward):
            continue
        key = (
            "default_reward_fn_type" if storage.default_reward_fn_type else "default_workflow_type"
        )
        problems.append(
            f"{origin_of(config, path, storage, key)} = {getattr(storage, key)} scores the "
            f"rows of a storage_type: reasoning_gym taskset, and {path}.storage_type is "
            f"{storage.storage_type}: generate the tasks with reasoning_gym, or name another "
            "reward (default_reward_fn_type)"
        )
    return problems


def _ranges(storage: Any) -> Optional[dict]:
    """``seed_ranges`` of a reasoning_gym taskset; None where they cannot be known (the
    package missing, a key it rejects: said when its rows are generated)."""
    if storage.storage_type != STORAGE_TYPE or storage.reasoning_gym is None:
        return None
    if importlib.util.find_spec("reasoning_gym") is None:
        return None
    try:
        return seed_ranges(storage.reasoning_gym)
    except ReasoningGymError:
        return None


def _overlap_problems(config: Config) -> List[str]:
    """Each held-out reasoning_gym taskset draws no row a training one draws."""
    training = [(p, r) for p, s in _tasksets(config, False) if (r := _ranges(s)) is not None]
    problems = []
    for path, storage in _tasksets(config, True):
        ranges = _ranges(storage) if training else None
        if not ranges:
            continue
        spec, shared, lowest = storage.reasoning_gym, [], 0
        for train_path, train_ranges in training:
            for key, (start, end) in ranges.items():
                train_start, train_end = train_ranges.get(key, (end, end))
                if start < train_end and train_start < end:
                    shared.append(f"{key[0]} with {train_path}")
                    lowest = max(lowest, train_end - (start - spec.seed))
        if shared:
            problems.append(
                f"{path}.reasoning_gym.seed = {spec.seed} draws rows the training tasksets "
                f"draw too ({'; '.join(shared)}: the same dataset and config, and row i comes "
                f"from Random(seed + i)), so it does not hold them out; set it to {lowest} or "
                "more"
            )
    return problems
