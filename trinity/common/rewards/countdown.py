"""Countdown: combine the given numbers with + - * / to reach the target.

Scores 1.0 for a correct equation that uses each given number exactly once, 0.1 for a
well-formed but wrong equation, 0.0 when no equation can be read. The numbers and target are
the row's ``nums`` and ``target`` columns, or the truth as the original Trinity-RFT's countdown
data writes it, JSON ``{"target": 22, "numbers": [3, 5, 7]}``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Dict, List, Optional, Tuple

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_EQUATION = re.compile(r"^[\d\s+\-*/().]+$")


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("unsupported expression")


def _equation(response: str) -> Optional[str]:
    tags = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    candidate = tags[-1] if tags else response.strip().splitlines()[-1] if response.strip() else ""
    candidate = candidate.split("=")[0].strip()
    return candidate if candidate and _EQUATION.match(candidate) else None


def _puzzle(truth: Optional[str], raw: Dict[str, Any]) -> Tuple[Any, List[int]]:
    """(target, numbers) of the row's columns, or of a JSON truth with both."""
    try:
        spec = json.loads(truth) if truth is not None else None
    except json.JSONDecodeError:
        spec = None
    if isinstance(spec, dict) and {"target", "numbers"} <= spec.keys():
        return spec["target"], [int(n) for n in spec["numbers"]]
    return raw.get("target", truth), [int(n) for n in raw.get("nums", [])]


@REWARD_FUNCTIONS.register_module("countdown_reward")
class CountdownReward(RewardFn):
    def __init__(self, format_score: float = 0.1) -> None:
        self.format_score = format_score

    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        target, nums = _puzzle(truth, kwargs.get("raw_task") or {})
        equation = _equation(response)
        if equation is None or target is None:
            return {"accuracy": 0.0, "format": 0.0}
        used = [int(n) for n in re.findall(r"\d+", equation)]
        try:
            value = _evaluate(ast.parse(equation, mode="eval"))
        except (ValueError, SyntaxError, ZeroDivisionError):
            return {"accuracy": 0.0, "format": self.format_score}
        correct = Counter(used) == Counter(nums) and value == Fraction(str(target))
        return {"accuracy": float(correct), "format": 0.0 if correct else self.format_score}
