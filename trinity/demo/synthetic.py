"""Synthetic, verifiable tasks generated from a seed (docs/design-notes.md, "Principles":
offline by construction).

Everything is written as ordinary JSON-lines files (``train.jsonl`` / ``test.jsonl``), so
``datasets.load_dataset("json", data_files=...)`` and the ``file`` storage read them like
any user dataset. The same arguments always produce the same files.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, Iterable, List, Tuple

from trinity.demo import read_marker
from trinity.demo.tiny import TINY_PRESETS, build_tiny_model

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def write_jsonl(path: str, rows: Iterable[Dict[str, Any]]) -> str:
    """Write ``rows`` as JSON lines to ``path`` (parent folders created); return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)  # readers never see a half-written file
    return path


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """Rows of a JSON-lines file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ arithmetic


def _arithmetic_row(index: int, digits: int, op: str) -> Dict[str, str]:
    """Question/answer for operand pair number ``index`` of the ``10**digits`` squared grid."""
    a, b = divmod(index, 10**digits)
    if op == "-" and a < b:  # keep answers non-negative: easier for a tiny model
        a, b = b, a
    return {"question": f"{a}{op}{b}=", "answer": str(_OPS[op](a, b))}


def _arithmetic_rows(
    n: int, *, digits: int, seed: int, op: str, exclude: Iterable[str] = ()
) -> List[Dict[str, str]]:
    """``n`` distinct arithmetic rows whose questions are not in ``exclude``."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got '{op}'")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    excluded = set(exclude)
    space = 10 ** (2 * digits)
    if n + len(excluded) > space:
        raise ValueError(
            f"asked for {n} distinct '{op}' problems with {digits} digit(s) avoiding "
            f"{len(excluded)} questions, but only {space} operand pairs exist; raise digits"
        )
    rows, seen = [], set(excluded)
    # Sampling pair indices without replacement keeps every question distinct; "-" maps
    # (a, b) and (b, a) to one question, so duplicates are skipped rather than assumed away.
    for index in random.Random(seed).sample(range(space), min(space, 2 * n + len(excluded))):
        row = _arithmetic_row(index, digits, op)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
            if len(rows) == n:
                return rows
    raise ValueError(f"could not draw {n} distinct '{op}' problems with {digits} digit(s)")


def make_arithmetic(
    out_dir: str, *, n_train: int, n_test: int, digits: int = 3, seed: int = 0, op: str = "+"
) -> Dict[str, str]:
    """Write ``train.jsonl`` / ``test.jsonl`` rows ``{"question": "123+456=", "answer": "579"}``.

    Operands are uniform in ``[0, 10**digits)``; no question appears twice, so train and
    test are disjoint. Returns ``{"train": path, "test": path}``.
    """
    rows = _arithmetic_rows(n_train + n_test, digits=digits, seed=seed, op=op)
    return {
        "train": write_jsonl(os.path.join(out_dir, "train.jsonl"), rows[:n_train]),
        "test": write_jsonl(os.path.join(out_dir, "test.jsonl"), rows[n_train:]),
    }


def make_arithmetic_sft(
    out_dir: str,
    *,
    n_train: int,
    digits: int = 3,
    seed: int = 0,
    op: str = "+",
    exclude: Iterable[str] = (),
) -> Dict[str, str]:
    """Write SFT warm-up rows ``{"prompt": "12+7=", "response": "19"}`` to ``train.jsonl``.

    Questions listed in ``exclude`` (e.g. an RL test set's) never appear. Returns
    ``{"train": path}``.
    """
    rows = _arithmetic_rows(n_train, digits=digits, seed=seed, op=op, exclude=exclude)
    sft = [{"prompt": r["question"], "response": r["answer"]} for r in rows]
    return {"train": write_jsonl(os.path.join(out_dir, "train.jsonl"), sft)}


# ------------------------------------------------------------------- countdown

COUNTDOWN_PROMPT = (
    "Combine the numbers {nums} with +, -, * and / to make {target}. "
    "Use every number exactly once. Put the final equation in <answer></answer>."
)


def _random_countdown(rng: random.Random, n_nums: int, max_num: int) -> Tuple[List[int], int, str]:
    """Numbers, target and one solving expression, built by combining random numbers."""
    while True:
        nums = [rng.randint(1, max_num) for _ in range(n_nums)]
        items = [(n, str(n)) for n in nums]  # (value, expression) pairs still to combine
        while len(items) > 1:
            (a, ea), (b, eb) = (items.pop(rng.randrange(len(items))) for _ in range(2))
            op = rng.choice("+-*/")
            if op == "-" and a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            if op == "/" and (b == 0 or a % b):  # only exact division keeps values integral
                op = "+"
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1)}[op]
            items.append((value, f"({ea} {op} {eb})"))
        target, expression = items[0]
        if 1 <= target <= 1000:
            rng.shuffle(nums)  # so the order of nums does not give the solution away
            return nums, target, expression[1:-1]


def make_countdown(
    out_dir: str,
    *,
    n_train: int,
    n_test: int,
    seed: int = 0,
    n_nums: Tuple[int, int] = (3, 4),
    max_num: int = 99,
) -> Dict[str, str]:
    """Write countdown ``train.jsonl`` / ``test.jsonl`` rows.

    Each row is ``{"nums", "target", "question", "answer": str(target), "solution"}``;
    ``solution`` is an expression using every number once that evaluates to ``target``,
    so every instance is solvable. No (numbers, target) instance is repeated, so train
    and test are disjoint. Returns ``{"train": path, "test": path}``.
    """
    if not 2 <= n_nums[0] <= n_nums[1]:
        raise ValueError(f"n_nums must be a (low, high) range with 2 <= low <= high, got {n_nums}")
    rng = random.Random(seed)
    rows: List[Dict[str, Any]] = []
    seen = set()
    for _ in range(100 * (n_train + n_test)):
        nums, target, solution = _random_countdown(rng, rng.randint(*n_nums), max_num)
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        question = COUNTDOWN_PROMPT.format(nums=nums, target=target)
        rows.append(
            dict(nums=nums, target=target, question=question, answer=str(target), solution=solution)
        )
        if len(rows) == n_train + n_test:
            return {
                "train": write_jsonl(os.path.join(out_dir, "train.jsonl"), rows[:n_train]),
                "test": write_jsonl(os.path.join(out_dir, "test.jsonl"), rows[n_train:]),
            }
    raise ValueError(f"could not draw {n_train + n_test} distinct countdown instances")


# ------------------------------------------------------------------ quickstart


def prepare_quickstart(
    root: str,
    *,
    preset: str = "tiny",
    digits: int = 2,
    op: str = "+",
    n_sft: int = 8000,
    n_train: int = 2000,
    n_test: int = 200,
    seed: int = 0,
) -> Dict[str, str]:
    """Build the tiny model and arithmetic data a quickstart run needs; reuse what exists.

    Layout: ``root/model`` (HF folder), ``root/data/sft/train.jsonl`` (prompt/response),
    ``root/data/rl/{train,test}.jsonl`` (question/answer). The SFT set avoids every RL
    test question. Returns ``{"model_path", "sft_path", "rl_path"}``.
    """
    if preset not in TINY_PRESETS:
        raise KeyError(f"unknown tiny preset '{preset}'; choose one of {sorted(TINY_PRESETS)}")
    root = os.path.abspath(root)
    model_path = build_tiny_model(os.path.join(root, "model"), seed=seed, **TINY_PRESETS[preset])
    data_args = dict(digits=digits, op=op, n_sft=n_sft, n_train=n_train, n_test=n_test, seed=seed)
    sft_path, rl_path = os.path.join(root, "data", "sft"), os.path.join(root, "data", "rl")
    marker = os.path.join(root, "data", "quickstart.json")
    if read_marker(marker) != data_args:
        rl = make_arithmetic(
            rl_path, n_train=n_train, n_test=n_test, digits=digits, seed=seed, op=op
        )
        test_questions = [row["question"] for row in read_jsonl(rl["test"])]
        make_arithmetic_sft(
            sft_path, n_train=n_sft, digits=digits, seed=seed + 1, op=op, exclude=test_questions
        )
        with open(marker, "w") as f:
            json.dump(data_args, f, indent=2)
    return {"model_path": model_path, "sft_path": sft_path, "rl_path": rl_path}
