"""``reward_filter``: keeps experiences whose reward lies in ``[min_reward, max_reward]``."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from trinity.buffer.operators.base import OPERATORS, Metrics, Operator, check_bounds, select
from trinity.common.experience import Experience


@OPERATORS.register_module("reward_filter")
class RewardFilter(Operator):
    """Keeps experiences with ``min_reward <= reward <= max_reward``.

    With a group algorithm (GRPO...) the test applies to each group's mean reward and the
    group is kept or dropped whole: e.g. ``max_reward: 0.99`` drops the tasks every rollout
    already solves, whose advantages are all zero. An experience without a reward fails.

    Args:
        min_reward: the lowest kept; unset: no lower bound.
        max_reward: the highest kept; unset: no upper bound.
    """

    kinds = ("experience",)

    def __init__(self, min_reward: Optional[float] = None, max_reward: Optional[float] = None):
        if min_reward is None and max_reward is None:
            raise ValueError("set min_reward, max_reward or both: without them nothing is filtered")
        check_bounds(min_reward, max_reward, "min_reward, max_reward")
        self.min_reward, self.max_reward = min_reward, max_reward

    def _keeps(self, reward: Optional[float]) -> bool:
        if reward is None:
            return False
        if self.min_reward is not None and reward < self.min_reward:
            return False
        return self.max_reward is None or reward <= self.max_reward

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        missing = float(sum(1 for e in exps if e.reward is None))
        if not whole_groups:
            return select(exps, [self._keeps(e.reward) for e in exps], False), {
                "no_reward": missing
            }
        rewards: Dict[str, List[Optional[float]]] = defaultdict(list)
        for e in exps:
            rewards[e.group_id].append(e.reward)
        keeps = {g: self._keeps(_mean(values)) for g, values in rewards.items()}
        return [e for e in exps if keeps[e.group_id]], {"no_reward": missing}


def _mean(values: List[Optional[float]]) -> Optional[float]:
    if any(v is None for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]
