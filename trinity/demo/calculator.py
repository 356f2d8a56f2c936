"""Calculator: a synthetic tool-use task. Multiply two 2-digit numbers, with a ``calc`` tool.

A tiny model cannot multiply 2-digit numbers itself, but it can learn to call the tool
(``<tool_call>{"name": "calc", "arguments": {"expression": "37*48"}}</tool_call>``) and copy
its result into the answer. The SFT warm-up imitates a player that calls the tool on half of
the questions and answers the others with an estimate (the product rounded to tens, usually
wrong); RL has to discover that calling the tool pays.

Tasks are JSON lines ``{"question": "37*48", "answer": "1776"}``; the held-out test split
uses first factors no training question uses. The SFT rows are OpenAI-style ``messages`` with
``tool_calls`` and a ``tools`` column (the SFT reader's ``format.tools_key``).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import random
from typing import Any, Dict, List, Tuple

from trinity.demo import read_marker

CALC_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an integer arithmetic expression (+, -, *, parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_MAX_DIGITS = 30  # a result longer than this is refused: no unbounded work from model output
TEST_FRACTION = 0.25  # share of first factors held out for the test questions


def calculate(expression: str) -> str:
    """The ``calc`` tool: the value of an integer expression, or ``error: ...`` (never raises)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](value(node.left), value(node.right))
            if len(str(abs(result))) > _MAX_DIGITS:
                raise ValueError("result too large")
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"unsupported: {ast.dump(node)[:40]}")

    try:
        return str(value(ast.parse(str(expression).strip(), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


def split_factors(seed: int, test_fraction: float = TEST_FRACTION) -> Tuple[List[int], List[int]]:
    """(train, test) first factors: a seeded partition of 10..99."""
    factors = list(range(10, 100))
    random.Random(seed).shuffle(factors)
    n_test = round(len(factors) * test_fraction)
    return sorted(factors[n_test:]), sorted(factors[:n_test])


def _questions(firsts: List[int], n: int, rng: random.Random) -> List[Dict[str, str]]:
    pairs = [(a, b) for a in firsts for b in range(10, 100)]
    if n > len(pairs):
        raise ValueError(f"asked for {n} questions but only {len(pairs)} distinct ones exist")
    return [{"question": f"{a}*{b}", "answer": str(a * b)} for a, b in rng.sample(pairs, n)]


def tool_dialogue(question: str, answer: str, call_id: str = "call_0") -> List[Dict[str, Any]]:
    """The dialogue of a player that calls ``calc`` and answers with its result."""
    call = {"name": "calc", "arguments": {"expression": question}}
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": calculate(question)},
        {"role": "assistant", "content": answer},
    ]


def estimate_dialogue(question: str) -> List[Dict[str, Any]]:
    """The dialogue of a player that answers at once with the product rounded to tens."""
    guess = round(int(calculate(question)), -1)
    return [{"role": "user", "content": question}, {"role": "assistant", "content": str(guess)}]


def make_calculator(
    out_dir: str, *, n_train: int, n_test: int, n_sft: int, tool_rate: float = 0.5, seed: int = 0
) -> Dict[str, str]:
    """Write ``rl/{train,test}.jsonl`` questions and ``sft/train.jsonl`` dialogues (on
    training factors; a ``tool_rate`` share calls the tool). Returns their folders."""
    from trinity.demo.synthetic import write_jsonl  # loads transformers: not for rollouts

    train_firsts, test_firsts = split_factors(seed)
    rng = random.Random(seed + 1)
    rl_dir, sft_dir = os.path.join(out_dir, "rl"), os.path.join(out_dir, "sft")
    write_jsonl(os.path.join(rl_dir, "train.jsonl"), _questions(train_firsts, n_train, rng))
    write_jsonl(os.path.join(rl_dir, "test.jsonl"), _questions(test_firsts, n_test, rng))
    sft_rows = [
        {
            "messages": tool_dialogue(q["question"], q["answer"])
            if rng.random() < tool_rate
            else estimate_dialogue(q["question"]),
            "tools": [CALC_TOOL],
        }
        for q in _questions(train_firsts, n_sft, rng)
    ]
    write_jsonl(os.path.join(sft_dir, "train.jsonl"), sft_rows)
    return {"rl_path": rl_dir, "sft_path": sft_dir}


def prepare_calculator(
    root: str,
    *,
    preset: str = "tiny",
    n_train: int = 1024,
    n_test: int = 128,
    n_sft: int = 2000,
    seed: int = 0,
) -> Dict[str, str]:
    """Build the tiny model (its chat template renders tools) and the data under ``root``;
    reuse what exists. Returns ``{"model_path", "sft_path", "rl_path"}``."""
    from trinity.demo.tiny import build_tiny_preset

    root = os.path.abspath(root)
    model_path = build_tiny_preset(os.path.join(root, "model"), preset, seed=seed)
    data_dir = os.path.join(root, "data")
    args = dict(n_train=n_train, n_test=n_test, n_sft=n_sft, seed=seed)
    marker = os.path.join(data_dir, "calculator.json")
    paths = {"rl_path": os.path.join(data_dir, "rl"), "sft_path": os.path.join(data_dir, "sft")}
    if read_marker(marker) != args:
        paths = make_calculator(data_dir, **args)
        with open(marker, "w") as f:
            json.dump(args, f, indent=2)
    return {"model_path": model_path, **paths}
