# A reward an untrained model earns about half the time, so every algorithm sees reward
# variance (and non-zero advantages) within a few steps of a test run.
from typing import Any, Dict, Optional

from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn


@REWARD_FUNCTIONS.register_module("parity_reward")
class ParityReward(RewardFn):
    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        return {"accuracy": float(len(response) % 2 == 0)}
