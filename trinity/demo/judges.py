"""A tiny judge for the RULER and rubric examples (``examples/judges``).

An LLM judge must reply in the format its workflow reads (``k: score`` lines for RULER, a
lone score per rubric criterion), and a reply that is not is a failed task, retried: a
randomly initialised model never writes one, so the quickstart's model cannot judge these.
``prepare_judges`` therefore builds, beside the quickstart's policy model and arithmetic data
(``prepare_quickstart``), ``root/judge``: the micro model fine-tuned by teacher forcing on
judgments of arithmetic answers that this module computes, prompted exactly as the examples'
``judge_prompt`` (``RULER_PROMPT``, ``RUBRIC_PROMPT``; a test holds the YAML to them). It
learns the formats (about 19 replies in 20 read at greedy sampling after 300 steps) and the
judging only in part; point ``JUDGE_MODEL`` at a real chat model for real verdicts.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import string
from typing import Dict, List, Tuple

from trinity.demo import read_marker
from trinity.demo.tiny import build_tiny_preset

# The examples' judge_prompt values (examples/judges/*.yaml), which the judge is taught on.
RULER_PROMPT = (
    "Question: {question}\nAnswers:\n{answers}\nScore each answer from 0 to {max_score} "
    "against the others, one line each as number: score."
)
RUBRIC_PROMPT = (
    "Question: {question}\nReference: {reference}\nAnswer: {answer}\nCriterion: {criterion}\n"
    "Score the answer on the criterion from 0 to {max_score}; reply with the score only."
)
# examples/judges/rubric.yaml's criteria: description -> does an answer meet it
CRITERIA = {
    "the answer equals the reference": lambda answer, truth: answer == str(truth),
    "the answer is a whole number": lambda answer, truth: answer.isdigit(),
}
MAX_SCORE = 10
GROUP_SIZES = (2, 3, 4, 4, 4)  # the RULER example judges groups of 4
_NOISE = string.ascii_letters + string.digits + string.punctuation + " "


def _answer(rng: random.Random, truth: int) -> str:
    """An answer a policy might give: right, near, another number, or a random string (what
    an untrained model writes)."""
    kind = rng.random()
    if kind < 0.3:
        return str(truth)
    if kind < 0.6:
        return str(max(0, truth + rng.choice([-10, -2, -1, 1, 2, 10])))
    if kind < 0.7:
        return str(rng.randint(0, 199))
    return "".join(rng.choice(_NOISE) for _ in range(rng.randint(0, 8))).strip()


def ruler_score(answer: str, truth: int) -> int:
    """10 for the right number, one less per unit off, 0 for anything but a number."""
    return max(0, MAX_SCORE - abs(int(answer) - truth)) if answer.isdigit() else 0


def judgments(n: int, seed: int) -> List[Tuple[str, str]]:
    """``n`` (judge prompt, reply) pairs, half RULER groups and half rubric verdicts, on
    two-digit additions."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        question, truth = f"{a}+{b}=", a + b
        if rng.random() < 0.5:
            answers = [_answer(rng, truth) for _ in range(rng.choice(GROUP_SIZES))]
            listed = "\n".join(f"{k}) {x}" for k, x in enumerate(answers, 1))
            prompt = RULER_PROMPT.format(question=question, answers=listed, max_score=MAX_SCORE)
            reply = "\n".join(f"{k}: {ruler_score(x, truth)}" for k, x in enumerate(answers, 1))
        else:
            criterion, meets = rng.choice(sorted(CRITERIA.items()))
            answer = _answer(rng, truth)
            prompt = RUBRIC_PROMPT.format(
                question=question,
                reference=truth,
                answer=answer,
                criterion=criterion,
                max_score=MAX_SCORE,
            )
            reply = str(MAX_SCORE if meets(answer, truth) else 0)
        pairs.append((prompt, reply))
    return pairs


def train_judge(path: str, pairs: List[Tuple[str, str]], steps: int, seed: int) -> None:
    """Fine-tune the model at ``path`` in place on (user message, reply) pairs: loss on the
    reply and its end-of-turn token only, AdamW with warm-up and cosine decay."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    end = tokenizer.eos_token  # the chat template's end of turn: the engine stops there
    rows = []
    for prompt, reply in pairs:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        context = tokenizer.encode(text, add_special_tokens=False)
        target = tokenizer.encode(reply + end, add_special_tokens=False)
        rows.append((context + target, [-100] * len(context) + target))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for step in range(steps):
        batch = rng.sample(rows, min(32, len(rows)))
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        warm = min(1.0, (step + 1) / 30)
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
        model(input_ids=ids, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(path)


def prepare_judges(
    root: str, *, steps: int = 300, n_judgments: int = 3000, seed: int = 0
) -> Dict[str, str]:
    """The quickstart's model and data under ``root`` and the tiny judge at ``root/judge``;
    reuse what exists. Returns ``prepare_quickstart``'s paths and ``judge_path``."""
    from trinity.demo.synthetic import prepare_quickstart

    root = os.path.abspath(root)
    paths = prepare_quickstart(root)
    judge = os.path.join(root, "judge")
    marker = os.path.join(judge, "judge.json")
    settings = {"steps": steps, "n_judgments": n_judgments, "seed": seed}
    if read_marker(marker) != settings:
        shutil.rmtree(judge, ignore_errors=True)  # never train on top of another judge
        build_tiny_preset(judge, "micro", seed=seed)
        train_judge(judge, judgments(n_judgments, seed), steps, seed)
        with open(marker, "w") as f:
            json.dump(settings, f, indent=2)
    return {**paths, "judge_path": judge}
