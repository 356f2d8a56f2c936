"""``math_dapo_reward``: DAPO's math reward with its overlong reward shaping (arXiv:2503.14476).

``accuracy`` is 1.0 when the answer is mathematically the truth: the answer is the content of
the last ``\\boxed{}`` after the last ``</think>`` (no box: that whole text), correct when
it normalises to the truth's spelling (``normalise_latex``) or ``math-verify`` finds the two
equal (the original used its own normaliser and sympy for that second test).

``format_score`` is DAPO's soft overlong punishment (its Eq. 13) when
``enable_overlong_penalty`` is set, with ``L_max = max_response_length`` and
``L_cache = cache_length`` counted in response tokens ``|y|``:
0 while ``|y| <= L_max - L_cache``; ``(L_max - L_cache - |y|) / L_cache * penalty_factor``
up to ``L_max``; ``-penalty_factor`` beyond. The built-in workflows pass ``|y|`` as
``response_tokens`` to a reward that declares ``takes_response_tokens``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn
from trinity.common.rewards.boxed import last_boxed, normalise_latex

# math-verify warns at every call made with its timeouts off (trinity/common/rewards/verified.py)
logging.getLogger("math_verify").setLevel(logging.ERROR)


def dapo_answer(response: str) -> str:
    """The answer DAPO grades: the last box after the thinking, else the text after it."""
    after_thinking = response.split("</think>")[-1]
    boxed = last_boxed(after_thinking)
    return (after_thinking if boxed is None else boxed).strip()


def same_value(answer: str, truth: str) -> bool:
    """The same spelling once normalised, or equal to ``math-verify``."""
    if normalise_latex(answer) == normalise_latex(truth):
        return True
    from math_verify import parse, verify

    # Boxed, each side is read whole as one LaTeX answer.
    gold = parse(f"\\boxed{{{truth}}}", parsing_timeout=None)
    guess = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    return bool(gold) and bool(guess) and verify(gold, guess, timeout_seconds=None)


def overlong_penalty(
    response_tokens: int, max_response_length: int, cache_length: int, penalty_factor: float
) -> float:
    """DAPO's soft overlong punishment of a response of ``response_tokens`` tokens."""
    expected = max_response_length - cache_length
    if response_tokens <= expected:
        return 0.0
    if response_tokens > max_response_length:
        return -penalty_factor
    return (expected - response_tokens) / cache_length * penalty_factor


@REWARD_FUNCTIONS.register_module("math_dapo_reward")
class MathDAPOReward(RewardFn):
    """``accuracy`` (the answer is the truth) and ``format_score`` (the overlong penalty)."""

    takes_response_tokens = True

    def __init__(
        self,
        enable_overlong_penalty: bool = False,
        penalty_factor: Optional[float] = None,
        max_response_length: Optional[int] = None,
        cache_length: Optional[int] = None,
    ) -> None:
        if enable_overlong_penalty:
            lengths = (penalty_factor, max_response_length, cache_length)
            if any(value is None for value in lengths):
                raise ValueError(
                    "enable_overlong_penalty needs penalty_factor, "
                    "max_response_length and cache_length"
                )
            if not 0 < cache_length < max_response_length:  # type: ignore[operator]
                raise ValueError(
                    f"cache_length ({cache_length}) must be above 0 and below "
                    f"max_response_length ({max_response_length})"
                )
        self.enable_overlong_penalty = enable_overlong_penalty
        self.penalty_factor = penalty_factor
        self.max_response_length = max_response_length
        self.cache_length = cache_length

    def __call__(
        self,
        response: str,
        truth: Optional[str] = None,
        response_tokens: Optional[int] = None,
        **kwargs: Any,
    ) -> Dict[str, float]:
        accuracy = float(truth is not None and same_value(dapo_answer(response), str(truth)))
        penalty = 0.0
        if self.enable_overlong_penalty:
            if response_tokens is None:
                raise ValueError(
                    "math_dapo_reward's overlong penalty needs the response's token count "
                    "(response_tokens), which the built-in workflows pass: use one, or set "
                    "reward_fn_args.enable_overlong_penalty: false"
                )
            penalty = overlong_penalty(
                response_tokens,
                self.max_response_length,  # type: ignore[arg-type]
                self.cache_length,  # type: ignore[arg-type]
                self.penalty_factor,  # type: ignore[arg-type]
            )
        return {"accuracy": accuracy, "format_score": penalty}
