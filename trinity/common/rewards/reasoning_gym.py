"""``reasoning_gym_reward``: a reasoning-gym dataset's own ``score_answer`` of a reply.

The answer is what reasoning-gym's ``extract_answer`` reads from the reply (the last
``<answer>...</answer>``; none: the dataset scores ``None``, 0 for every built-in one), scored
against the entry the row's ``reasoning_gym`` column rebuilds (``trinity.common.reasoning_gym``).
The rows are those of a ``storage_type: reasoning_gym`` taskset; the reward is the score (0..1,
some datasets give partial credit), one ``accuracy`` component.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from trinity.common.reasoning_gym import COLUMN, score
from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn


@REWARD_FUNCTIONS.register_module("reasoning_gym_reward")
class ReasoningGymReward(RewardFn):
    """The row's reasoning-gym dataset scores the reply's tagged answer."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        row = kwargs.get("raw_task") or {}
        if not isinstance(row.get(COLUMN), dict):
            raise ValueError(
                f"reasoning_gym_reward scores rows of a storage_type: reasoning_gym taskset "
                f"(their '{COLUMN}' column); this row has columns {sorted(row)}"
            )
        return {"accuracy": score(response or "", row[COLUMN])}
