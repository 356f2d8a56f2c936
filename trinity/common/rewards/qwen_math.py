"""The Qwen2.5-Math evaluation's answer check, as the original Trinity-RFT's
``math_eval_workflow`` and ``on_policy_distill_math_workflow`` score answers.

The final answer of a text (response or reference alike) is the last ``\\boxed{}``, else what
follows "the answer is" / "final answer is" (up to the line's end), else the last number
(GSM8K's ``#### 72`` ends in one). Two answers agree when they normalise to the same
spelling (``normalise_latex``) or are the same number within a relative 1e-4, or that number
and its percentage (``50`` and ``0.5``), as Qwen's grader allows.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from trinity.common.rewards.boxed import last_boxed, normalise_latex
from trinity.common.rewards.math import to_number

_ANSWER_IS = re.compile(r"(?:final|the)\s+answer\s+is\s*:?\s*([^\n]+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?\d*\.?\d+")


def final_answer(text: str) -> Optional[str]:
    """The answer ``text`` ends with, None when it states none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    stated = _ANSWER_IS.search(text)
    if stated:
        return stated.group(1).strip().rstrip(".")
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4)


def answers_agree(answer: str, reference: str) -> bool:
    """Same normalised spelling, or the same number (or it and its percentage)."""
    a, b = normalise_latex(answer), normalise_latex(reference)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    if x is None or y is None:
        return False
    return any(_close(float(x), float(y) * scale) for scale in (1, 0.01, 100))


def qwen_math_correct(response: str, truth: Optional[str]) -> bool:
    """The response's final answer agrees with the reference's."""
    if truth is None:
        return False
    answer, reference = final_answer(response), final_answer(str(truth))
    return answer is not None and reference is not None and answers_agree(answer, reference)
