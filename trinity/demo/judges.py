"""A tiny judge for the RULER and rubric examples (``examples/judges``).

An LLM judge must reply in the format its workflow reads (``k: score`` lines for RULER, a
lone score per rubric criterion), and a reply that is not is a failed task, retried: a
randomly initialised model never writes one, so the quickstart's model cannot judge these.
``prepare_judges`` therefore builds, beside the quickstart's policy model and arithmetic data
(``prepare_quickstart``), ``root/judge``: the micro model fine-tuned by teacher forcing on
judgments of arithmetic answers that this module computes, prompted exactly as the examples'
``judge_prompt`` (``RULER_PROMPT``, ``RUBRIC_PROMPT``; a test holds the YAML to them). The
answers it is taught on range from numbers to the random strings an untrained policy writes,
and it is built only once its greedy replies to held-out judgments are in the format (at least
``MIN_READ_RATE`` of them; 96.5-99.5% after the first 300 steps for seeds 0-3 on an Intel
Xeon); it judges only in part. Point ``JUDGE_MODEL`` at a real chat model for real verdicts.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import string
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from trinity.demo import DemoBuildError, read_marker
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
# What an untrained policy writes: up to 8 characters of its vocabulary, newlines included
# (the examples' max_response_tokens: 8, and the quickstart's tokenizer is character-level).
_NOISE = string.ascii_letters + string.digits + string.punctuation + " \n"
# The judge is checked on held-out judgments after training: at least this share of its
# greedy replies must be in the taught format, else it trains on (ROUNDS times in all).
MIN_READ_RATE = 0.95
ROUNDS = 3
_REPLY_TOKENS = 32  # the examples' judge_max_tokens


class Judgment(NamedTuple):
    """One judge prompt, the reply the judge is taught, and what they were made from."""

    prompt: str
    reply: str
    truth: int  # the sum the question asks for
    answers: Tuple[str, ...]  # a RULER group's answers, or the one answer a rubric scores
    criterion: Optional[str]  # the rubric criterion (a CRITERIA key); None for RULER


def _answer(rng: random.Random, truth: int, noise: float) -> str:
    """An answer a policy might give: with probability ``noise`` a random string (what an
    untrained policy writes), else the right number, a near one or another number."""
    if rng.random() < noise:
        length = 8 if rng.random() < 0.5 else rng.randint(0, 7)  # 8: a reply cut at the limit
        return "".join(rng.choice(_NOISE) for _ in range(length))
    kind = rng.random()
    if kind < 0.45:
        return str(truth)
    if kind < 0.9:
        return str(max(0, truth + rng.choice([-10, -2, -1, 1, 2, 10])))
    return str(rng.randint(0, 199))


def ruler_score(answer: str, truth: int) -> int:
    """10 for the right number, one less per unit off, 0 for anything but a number."""
    return max(0, MAX_SCORE - abs(int(answer) - truth)) if answer.isdigit() else 0


def judgments(n: int, seed: int) -> List[Judgment]:
    """``n`` judgments, half RULER groups and half rubric verdicts, on two-digit additions.

    Each draws the share of random-string answers from 0 to 1, so that groups the way an
    untrained policy answers (all noise) are as common as groups of numbers."""
    rng = random.Random(seed)
    made = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        question, truth, noise = f"{a}+{b}=", a + b, rng.random()
        if rng.random() < 0.5:
            answers = [_answer(rng, truth, noise) for _ in range(rng.choice(GROUP_SIZES))]
            listed = "\n".join(f"{k}) {x}" for k, x in enumerate(answers, 1))
            prompt = RULER_PROMPT.format(question=question, answers=listed, max_score=MAX_SCORE)
            reply = "\n".join(f"{k}: {ruler_score(x, truth)}" for k, x in enumerate(answers, 1))
            made.append(Judgment(prompt, reply, truth, tuple(answers), None))
            continue
        criterion, meets = rng.choice(sorted(CRITERIA.items()))
        answer = _answer(rng, truth, noise)
        prompt = RUBRIC_PROMPT.format(
            question=question,
            reference=truth,
            answer=answer,
            criterion=criterion,
            max_score=MAX_SCORE,
        )
        reply = str(MAX_SCORE if meets(answer, truth) else 0)
        made.append(Judgment(prompt, reply, truth, (answer,), criterion))
    return made


def in_format(judgment: Judgment, reply: str) -> bool:
    """Whether ``reply`` is in the format the judge is taught for ``judgment`` (whatever the
    scores): ``k: score`` lines for answers 1..n in order, or a lone score; both workflows
    read such a reply."""
    scores = reply.split("\n") if judgment.criterion is None else [f"1: {reply}"]
    if len(scores) != len(judgment.answers):
        return False
    for k, line in enumerate(scores, 1):
        index, _, score = line.partition(": ")
        if index != str(k) or not score.isdigit() or int(score) > MAX_SCORE:
            return False
    return True


def _chat_ids(tokenizer: Any, prompt: str) -> List[int]:
    """The token ids of ``prompt`` as one user message and the opening of the reply."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def train_judge(model: Any, tokenizer: Any, made: List[Judgment], steps: int, seed: int) -> None:
    """Fine-tune ``model`` in place on the judgments' (prompt, reply) pairs: loss on the reply
    and its end-of-turn token only, AdamW with warm-up and cosine decay, batches of 32."""
    import torch

    torch.manual_seed(seed)
    end = tokenizer.eos_token  # the chat template's end of turn: the engine stops there
    rows = []
    for judgment in made:
        context = _chat_ids(tokenizer, judgment.prompt)
        target = tokenizer.encode(judgment.reply + end, add_special_tokens=False)
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


def read_rate(model: Any, tokenizer: Any, made: List[Judgment]) -> float:
    """The share of ``made`` whose greedy reply from ``model`` is ``in_format``."""
    import torch

    model.eval()
    readable = 0
    with torch.no_grad():
        for judgment in made:
            ids = torch.tensor([_chat_ids(tokenizer, judgment.prompt)])
            out = model.generate(
                ids,
                max_new_tokens=_REPLY_TOKENS,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            reply = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            readable += in_format(judgment, reply)
    return readable / len(made)


def prepare_judges(
    root: str, *, steps: int = 300, n_judgments: int = 3000, seed: int = 0
) -> Dict[str, str]:
    """The quickstart's model and data under ``root`` and the tiny judge at ``root/judge``;
    reuse what exists. Returns ``prepare_quickstart``'s paths and ``judge_path``.

    The judge trains ``steps`` steps, then replies greedily to 200 held-out judgments; while
    fewer than ``MIN_READ_RATE`` of its replies are in the format, it trains ``steps`` more
    (a warm restart of the schedule, up to ``ROUNDS`` rounds), else ``DemoBuildError``: the same
    seed takes another path on another kind of CPU (its kernels round differently)."""
    from trinity.demo.synthetic import prepare_quickstart

    root = os.path.abspath(root)
    paths = prepare_quickstart(root)
    judge = os.path.join(root, "judge")
    marker = os.path.join(judge, "judge.json")
    settings = {"steps": steps, "n_judgments": n_judgments, "seed": seed, "min": MIN_READ_RATE}
    built = read_marker(marker) or {}
    if any(built.get(key) != value for key, value in settings.items()):
        shutil.rmtree(judge, ignore_errors=True)  # never train on top of another judge
        build_tiny_preset(judge, "micro", seed=seed)
        rates = _train_until_read(judge, judgments(n_judgments, seed), steps, seed)
        with open(marker, "w") as f:
            json.dump({**settings, "read_rates": rates}, f, indent=2)
    return {**paths, "judge_path": judge}


def _train_until_read(path: str, made: List[Judgment], steps: int, seed: int) -> List[float]:
    """Train the model at ``path`` in rounds until ``read_rate`` reaches ``MIN_READ_RATE``;
    save it and return each round's rate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    held_out = judgments(200, seed + 1)
    rates: List[float] = []
    while len(rates) < ROUNDS:
        train_judge(model, tokenizer, made, steps, seed + len(rates))
        rates.append(read_rate(model, tokenizer, held_out))
        if rates[-1] >= MIN_READ_RATE:
            model.save_pretrained(path)
            return rates
    raise DemoBuildError(
        f"the tiny judge at {path} replies in the format to {rates[-1]:.0%} of held-out "
        f"judgments after {ROUNDS} x {steps} steps (needs {MIN_READ_RATE:.0%}); build it with "
        "more steps (trinity.demo.judges.prepare_judges(root, steps=...)) or set JUDGE_MODEL "
        "to a chat model"
    )
