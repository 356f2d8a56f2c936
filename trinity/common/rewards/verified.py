"""``math_verify_reward``: the answer read from free text by ``math-verify``.

``math-verify`` (Hugging Face's answer checker) parses the final answer a model wrote,
whether LaTeX (``\\boxed{74}``, ``\\frac{1}{2}``) or plain text ("so she has 74 stickers"),
and compares it with the truth symbolically. Its own timeouts use ``signal.alarm``, which
only works in a process's main thread; workflows run in runner threads, so they are off here
and ``explorer.max_timeout`` bounds a task instead.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn

# math-verify warns at every call made with its timeouts off; the reason is above
logging.getLogger("math_verify").setLevel(logging.ERROR)


@REWARD_FUNCTIONS.register_module("math_verify_reward")
class MathVerifyReward(RewardFn):
    """1.0 when ``math-verify`` finds the truth's value as the response's final answer."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        from math_verify import parse, verify

        if truth is None:
            return {"accuracy": 0.0}
        answer = parse(response, parsing_timeout=None)
        ok = bool(answer) and verify(
            parse(truth, parsing_timeout=None), answer, timeout_seconds=None
        )
        return {"accuracy": float(ok)}
