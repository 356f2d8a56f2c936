"""A reward function that raises on every response: a workflow that fails at run time
(the config checks before start cannot see it; an unknown reward name they do catch)."""

from typing import Any, Dict, Optional

from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn


@REWARD_FUNCTIONS.register_module("failing_reward")
class FailingReward(RewardFn):
    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        raise ValueError("failing_reward cannot score any response")
