"""Answer-checking rewards for math-style tasks.

Answer extraction order: the last ``\\boxed{...}``, else the last ``<answer>...</answer>``,
else the last number in the text. A reference answer is read the same way, or after GSM8K's
``####`` marker.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Dict, Optional

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_FRAC = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
# An exact Fraction of ``1e10000000`` is a ten-million-digit integer (seconds to build, and a
# dataset row may hold a longer exponent): past this size a number is compared as text.
MAX_EXPONENT = 10_000


def _last_boxed(text: str) -> Optional[str]:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_answer(text: str) -> Optional[str]:
    """The final answer written in ``text``, or None if there is none."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def to_number(text: str) -> Optional[Fraction]:
    """Parse ``12``, ``-3.5``, ``1,000``, ``3/4``, ``\\frac{3}{4}``, ``2e3`` or ``$12$`` exactly.

    None for what is not a number, and for a number whose cost to hold exactly has no bound:
    an exponent beyond ``MAX_EXPONENT`` or more digits than Python turns into an ``int``
    (4,300 by default), so the cost grows with the text's length, never with the number's size.
    """
    s = _FRAC.sub(r"(\1)/(\2)", text).replace("$", "").replace(",", "").strip()
    s = s.replace("(", "").replace(")", "")
    for exponent in _EXPONENT.findall(s):
        digits = exponent.lstrip("+-").lstrip("0")
        if len(digits) > len(str(MAX_EXPONENT)) or int(digits or "0") > MAX_EXPONENT:
            return None
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(num.strip()) / Fraction(den.strip())
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().strip(".").lower())


def _final_answer(truth: str) -> str:
    """The answer part of a reference solution: after GSM8K's ``#### `` marker (its answers
    are worked solutions ending ``#### 72``), in a ``\\boxed{}`` or ``<answer>`` tag, or the
    whole text."""
    if "####" in truth:
        return truth.rsplit("####", 1)[1].strip()
    if "\\boxed{" in truth or "<answer>" in truth:
        return extract_answer(truth) or truth
    return truth


def answers_match(predicted: Optional[str], truth: Optional[str]) -> bool:
    """Numeric equality when both parse as numbers, normalized string equality otherwise."""
    if predicted is None or truth is None:
        return False
    truth_answer = _final_answer(truth)
    a, b = to_number(predicted), to_number(truth_answer)
    if a is not None and b is not None:
        return a == b
    return _normalize(predicted) == _normalize(truth_answer)


@REWARD_FUNCTIONS.register_module("math_reward")
class MathReward(RewardFn):
    """1.0 when the extracted final answer is mathematically equal to the truth."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        return {"accuracy": float(answers_match(extract_answer(response), truth))}


@REWARD_FUNCTIONS.register_module("accuracy_reward")
class AccuracyReward(RewardFn):
    """1.0 when the extracted answer equals the truth as normalized text (no number parsing)."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        answer = extract_answer(response)
        ok = answer is not None and truth is not None and _normalize(answer) == _normalize(truth)
        return {"accuracy": float(ok)}


@REWARD_FUNCTIONS.register_module("format_reward")
class FormatReward(RewardFn):
    """1.0 when the response is ``<think>...</think><answer>...</answer>`` and nothing else."""

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        return {"format": float(bool(_FORMAT.match(response)))}
