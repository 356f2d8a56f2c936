"""Reward functions, chosen per taskset by ``default_reward_fn_type``.

To add one: subclass ``RewardFn``, implement ``__call__(response, truth, **kwargs) -> dict``
returning named components (their sum is the reward; an ``accuracy`` component feeds
the accuracy metrics), and register it with ``@REWARD_FUNCTIONS.register_module("name")``
in a module under this package or a plugin directory (``--plugin-dir``); its constructor
takes ``reward_fn_args``. Interface and a tested example: docs/extending.md.
"""

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn, total_reward
from trinity.common.rewards.boxed import MathBoxedReward
from trinity.common.rewards.countdown import CountdownReward
from trinity.common.rewards.dapo import MathDAPOReward
from trinity.common.rewards.math import AccuracyReward, FormatReward, MathReward
from trinity.common.rewards.reasoning_gym import ReasoningGymReward
from trinity.common.rewards.toolcall import ToolCallReward
from trinity.common.rewards.verified import MathVerifyReward

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFn",
    "total_reward",
    "AccuracyReward",
    "FormatReward",
    "MathReward",
    "MathVerifyReward",
    "CountdownReward",
    "MathBoxedReward",
    "MathDAPOReward",
    "ReasoningGymReward",
    "ToolCallReward",
]
