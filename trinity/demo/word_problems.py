"""Word problems for a real chat model: 2-digit addition and subtraction asked in plain English.

The questions are what a user would type to an instruct model ("Sara has 59 stickers and gets
63 more. How many stickers does she have now?"), sent through the model's own chat
template, and answered in free text; the reward reads the answer with ``math-verify``
(``math_verify_reward``). SmolLM2-135M-Instruct answers about one in five of them right
greedily, and disagrees with itself within a group of samples often enough to give GRPO a
signal.

Rows: ``{"question": ..., "answer": "122"}`` for RL (train and a held-out test split with no
shared operand pair), chat ``messages`` for SFT (the question, then the number), and DPO
pairs (``prompt``, ``chosen``: the number, ``rejected``: the number off by ten).
"""

from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Tuple

from trinity.demo import read_marker
from trinity.demo.synthetic import write_jsonl

# Question templates; {a} and {b} are 2-digit numbers.
ADDITION = [
    "What is {a} + {b}?",
    "Sara has {a} stickers and gets {b} more from a friend. How many stickers does she have now?",
    "A shop sold {a} apples in the morning and {b} in the afternoon. How many apples did it "
    "sell in total?",
    "Tom read {a} pages on Monday and {b} pages on Tuesday. How many pages did he read?",
]
SUBTRACTION = [
    "What is {a} - {b}?",
    "A bus has {a} passengers and {b} get off. How many passengers are left on the bus?",
    "Mia had {a} coins and spent {b} of them. How many coins does she have left?",
]
# Asked of every question: the model's answers stay short (a CPU generates every token), and
# this phrasing scored best of those tried on SmolLM2 (0.15 greedy against 0.10).
INSTRUCTION = " Reply with only the number."


def _problem(rng: random.Random, pair: Tuple[int, int]) -> Tuple[str, int]:
    """(question, answer) for an operand pair: addition or subtraction, a random phrasing."""
    a, b = pair
    if rng.random() < 0.5:
        return rng.choice(ADDITION).format(a=a, b=b) + INSTRUCTION, a + b
    a, b = max(a, b), min(a, b)  # answers stay non-negative
    return rng.choice(SUBTRACTION).format(a=a, b=b) + INSTRUCTION, a - b


def make_word_problems(
    out_dir: str, *, n_train: int, n_test: int, n_sft: int, seed: int = 0
) -> Dict[str, str]:
    """RL ``rl/{train,test}.jsonl``, SFT ``sft/train.jsonl`` (messages) and DPO
    ``dpo/train.jsonl`` under ``out_dir``; the test split's operand pairs appear nowhere
    else. Returns ``{"rl_path", "sft_path", "dpo_path"}``."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    rng.shuffle(pairs)
    if n_train + n_test + n_sft > len(pairs):
        raise ValueError(f"asked for {n_train + n_test + n_sft} problems; {len(pairs)} exist")
    problems = [_problem(rng, pair) for pair in pairs[: n_train + n_test + n_sft]]
    train, test, sft = (
        problems[:n_train],
        problems[n_train : n_train + n_test],
        problems[n_train + n_test :],
    )
    rl = os.path.join(out_dir, "rl")
    write_jsonl(os.path.join(rl, "train.jsonl"), (_task(p) for p in train))
    write_jsonl(os.path.join(rl, "test.jsonl"), (_task(p) for p in test))
    sft_dir, dpo_dir = os.path.join(out_dir, "sft"), os.path.join(out_dir, "dpo")
    write_jsonl(os.path.join(sft_dir, "train.jsonl"), (_messages(p) for p in sft))
    write_jsonl(os.path.join(dpo_dir, "train.jsonl"), (preference_pair(p) for p in sft))
    return {"rl_path": rl, "sft_path": sft_dir, "dpo_path": dpo_dir}


def _task(problem: Tuple[str, int]) -> Dict[str, str]:
    return {"question": problem[0], "answer": str(problem[1])}


def _messages(problem: Tuple[str, int]) -> Dict[str, List[Dict[str, str]]]:
    question, answer = problem
    turns = [{"role": "user", "content": question}, {"role": "assistant", "content": str(answer)}]
    return {"messages": turns}


def preference_pair(problem: Tuple[str, int]) -> Dict[str, str]:
    """The right answer against the model's commonest mistake: the result off by ten (a
    carry dropped or added)."""
    question, answer = problem
    wrong = answer + 10 if answer < 90 else answer - 10
    return {"prompt": question, "chosen": str(answer), "rejected": str(wrong)}


def prepare_smollm2(
    root: str, *, n_train: int = 2000, n_test: int = 200, n_sft: int = 2000, seed: int = 0
) -> Dict[str, str]:
    """SmolLM2-135M-Instruct as a Hugging Face folder (``root/model``, from the ``smollm2``
    extra's GGUF file) and the word problems under ``root/data``; reuses what exists."""
    from trinity.demo.gguf import import_gguf

    root = os.path.abspath(root)
    model_path = import_gguf("smollm2", os.path.join(root, "model"))
    data_dir = os.path.join(root, "data")
    args = dict(n_train=n_train, n_test=n_test, n_sft=n_sft, seed=seed)
    marker = os.path.join(data_dir, "word_problems.json")
    paths = {
        key: os.path.join(data_dir, key.split("_")[0])
        for key in ("rl_path", "sft_path", "dpo_path")
    }
    if read_marker(marker) != args:
        paths = make_word_problems(data_dir, **args)
        with open(marker, "w") as f:
            json.dump(args, f, indent=2)
    return {"model_path": model_path, **paths}
