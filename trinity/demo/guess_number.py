"""Guess the number: a synthetic multi-turn environment a tiny character model can learn.

The environment holds a secret integer in ``[low, high]``. Each turn the model replies with a
number; the environment answers ``higher L-H`` / ``lower L-H`` (``L-H``: the interval the
answers so far leave) or ``correct``. A reply that is not a whole number ends the episode.
The episode is won when the secret is found within ``max_turns`` guesses.

Ranges hold ``2**k - 1`` numbers and ``max_turns`` is ``k``, so only a binary search (always
guessing the middle of the interval left) wins every time; guessing anywhere inside the
interval wins 68% of 7-number and 60% of 15-number games. The SFT warm-up teaches the
format from such random-but-valid play; RL has to discover the strategy. Feedback names the
interval left, so the best move is the middle of the last message's interval: a function even
the 88K-parameter ``micro`` model learns, unlike recalling the interval from every earlier answer.

Everything is generated from a seed and written as JSON lines (``prepare_guess_number``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

from trinity.demo import read_marker

TEST_FRACTION = 0.25  # share of opening ranges held out for the test games
Policy = Callable[[int, int], int]  # (low, high) of the interval left -> the next guess
_NUMBER = re.compile(r"[0-9]{1,6}")  # ASCII digits only ("²".isdigit() is True)


@dataclass(frozen=True)
class GuessNumberTask:
    """One game: the secret, the opening interval and the guesses allowed."""

    low: int
    high: int
    secret: int
    max_turns: int

    @classmethod
    def from_row(cls, row: Dict[str, Any]) -> GuessNumberTask:
        """The task of a data row ``{"low", "high", "secret", "max_turns"}`` (checked)."""
        missing = [k for k in ("low", "high", "secret", "max_turns") if k not in row]
        if missing:
            raise KeyError(
                f"a guess-the-number row needs columns low, high, secret, max_turns; "
                f"missing {', '.join(missing)} (columns: {sorted(row)})"
            )
        values = {k: row[k] for k in ("low", "high", "secret", "max_turns")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
            raise ValueError(f"low, high, secret and max_turns must be integers, got {values}")
        task = cls(**values)
        if not 0 <= task.low <= task.secret <= task.high or task.max_turns < 1:
            raise ValueError(f"need 0 <= low <= secret <= high and max_turns >= 1, got {values}")
        return task

    def to_row(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Feedback:
    """The environment's answer to one reply."""

    text: str  # what the environment says ("higher 8-14", "lower 0-6", "correct", "invalid")
    done: bool  # the episode is over (found, out of turns, or an invalid reply)
    success: bool  # the secret was found


class GuessNumberEnv:
    """One episode of a ``GuessNumberTask``: ``opening()``, then ``step(reply)`` per turn."""

    def __init__(self, task: GuessNumberTask) -> None:
        self.task = task
        self.low, self.high = task.low, task.high  # the interval the answers so far leave
        self.turns = 0
        self.done = False
        self.success = False

    def state(self) -> str:
        """The state the next reply answers: the interval left and the guesses left. Two
        episodes in equal states face the same game from there on, whatever led to it."""
        return f"{self.low}-{self.high} with {self.task.max_turns - self.turns} left"

    def opening(self) -> str:
        """The first message of the episode."""
        return f"guess {self.task.low}-{self.task.high}"

    def step(self, reply: str) -> Feedback:
        """Answer the model's reply; every reply, valid or not, uses one turn."""
        if self.done:
            raise RuntimeError("the episode is over; start a new GuessNumberEnv")
        self.turns += 1
        text = reply.strip()
        if not _NUMBER.fullmatch(text):
            self.done = True
            return Feedback("invalid", done=True, success=False)
        guess = int(text)
        if guess == self.task.secret:
            self.done = self.success = True
            return Feedback("correct", done=True, success=True)
        # Truthful even for a guess outside the interval; the interval only ever shrinks.
        if guess < self.task.secret:
            self.low, word = max(self.low, guess + 1), "higher"
        else:
            self.high, word = min(self.high, guess - 1), "lower"
        self.done = self.turns >= self.task.max_turns
        return Feedback(f"{word} {self.low}-{self.high}", done=self.done, success=False)


def turns_for(size: int) -> int:
    """Guesses a binary search needs in the worst case for ``size`` numbers."""
    return math.ceil(math.log2(size + 1))


def binary_search(low: int, high: int) -> int:
    """The optimal policy: the middle of the interval left."""
    return (low + high) // 2


def random_guess(rng: random.Random) -> Policy:
    """A valid but mediocre policy: a uniform guess inside the interval left."""
    return lambda low, high: rng.randint(low, high)


def play(task: GuessNumberTask, policy: Policy) -> Tuple[List[Dict[str, str]], bool]:
    """Play ``task`` with ``policy``; return the dialogue (user/assistant messages, ending
    with the last guess) and whether it won."""
    env = GuessNumberEnv(task)
    messages = [{"role": "user", "content": env.opening()}]
    while True:
        guess = str(policy(env.low, env.high))
        messages.append({"role": "assistant", "content": guess})
        feedback = env.step(guess)
        if feedback.done:
            return messages, feedback.success
        messages.append({"role": "user", "content": feedback.text})


# ---------------------------------------------------------------------------- data


def opening_ranges(max_value: int, sizes: Sequence[int]) -> List[Tuple[int, int]]:
    """Every ``(low, high)`` with ``high - low + 1`` in ``sizes`` inside ``[0, max_value]``."""
    bad = [s for s in sizes if s < 1 or s > max_value + 1]
    if bad:
        raise ValueError(f"sizes {bad} do not fit in 0-{max_value}; use 1 to {max_value + 1}")
    return [(lo, lo + s - 1) for s in sorted(set(sizes)) for lo in range(max_value - s + 2)]


def split_ranges(
    max_value: int, sizes: Sequence[int], test_fraction: float, seed: int
) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """(train, test) opening ranges: a seeded ``test_fraction`` of them is held out."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    ranges = opening_ranges(max_value, sizes)
    random.Random(seed).shuffle(ranges)
    n_test = max(1, round(len(ranges) * test_fraction))
    if n_test >= len(ranges):
        raise ValueError(f"only {len(ranges)} opening ranges: too few to hold some out")
    return ranges[n_test:], ranges[:n_test]


def _tasks(ranges: Iterable[Tuple[int, int]]) -> List[GuessNumberTask]:
    return [
        GuessNumberTask(lo, hi, secret, turns_for(hi - lo + 1))
        for lo, hi in ranges
        for secret in range(lo, hi + 1)
    ]


def _write_jsonl(path: str, rows: List[Dict[str, Any]]) -> str:
    # Imported here: the workflow imports this module, and the writer's module loads the model
    # builder (transformers), which a rollout never needs.
    from trinity.demo.synthetic import write_jsonl

    return write_jsonl(path, rows)


def _draw(tasks: List[GuessNumberTask], n: int, rng: random.Random, what: str) -> List[Dict]:
    if n > len(tasks):
        raise ValueError(
            f"asked for {n} {what} games but only {len(tasks)} distinct ones exist; "
            "raise max_value or ask for fewer"
        )
    return [t.to_row() for t in rng.sample(tasks, n)]


def make_guess_number(
    out_dir: str,
    *,
    n_train: int,
    n_test: int,
    seed: int = 0,
    max_value: int = 31,
    sizes: Sequence[int] = (7, 15),
    test_fraction: float = TEST_FRACTION,
) -> Dict[str, str]:
    """Write ``train.jsonl`` / ``test.jsonl`` game rows ``{"low", "high", "secret",
    "max_turns"}``; ``max_turns`` is what a binary search needs.

    Test games open with ranges no training game opens with (a seeded ``test_fraction`` of
    the opening ranges); no game appears twice. Returns ``{"train": path, "test": path}``.
    """
    train_ranges, test_ranges = split_ranges(max_value, sizes, test_fraction, seed)
    rng = random.Random(seed + 1)
    return {
        "train": _write_jsonl(
            os.path.join(out_dir, "train.jsonl"), _draw(_tasks(train_ranges), n_train, rng, "train")
        ),
        "test": _write_jsonl(
            os.path.join(out_dir, "test.jsonl"), _draw(_tasks(test_ranges), n_test, rng, "test")
        ),
    }


def make_guess_number_sft(
    out_dir: str,
    *,
    n_dialogues: int,
    ranges: Sequence[Tuple[int, int]],
    seed: int = 0,
) -> Dict[str, str]:
    """Write ``train.jsonl`` rows ``{"messages": [...]}``: won games of the random-guess
    policy, each opening with one of ``ranges``.

    The dialogue ends with the winning guess (the SFT reader trains every assistant turn with
    ``format.enable_concatenated_multi_turn``). Returns ``{"train": path}``.
    """
    tasks = _tasks(ranges)
    if not tasks:
        raise ValueError("no opening ranges to play: give at least one (low, high)")
    rng = random.Random(seed)
    policy, rows = random_guess(rng), []
    while len(rows) < n_dialogues:
        messages, won = play(rng.choice(tasks), policy)
        if won:
            rows.append({"messages": messages})
    return {"train": _write_jsonl(os.path.join(out_dir, "train.jsonl"), rows)}


def prepare_guess_number(
    root: str,
    *,
    preset: str = "micro",
    n_sft: int = 4000,
    n_train: int = 256,
    n_test: int = 64,
    max_value: int = 31,
    sizes: Sequence[int] = (7, 15),
    seed: int = 0,
) -> Dict[str, str]:
    """Build the tiny model, the RL games and the SFT warm-up dialogues; reuse what exists.

    Layout: ``root/model`` (HF folder), ``root/data/sft/train.jsonl`` (messages),
    ``root/data/rl/{train,test}.jsonl`` (games). SFT dialogues open only with training
    ranges. Returns ``{"model_path", "sft_path", "rl_path"}``.
    """
    from trinity.demo.tiny import build_tiny_preset

    root = os.path.abspath(root)
    model_path = build_tiny_preset(os.path.join(root, "model"), preset, seed=seed)
    sft_path, rl_path = os.path.join(root, "data", "sft"), os.path.join(root, "data", "rl")
    data_args = dict(n_sft=n_sft, n_train=n_train, n_test=n_test, seed=seed)
    data_args.update(max_value=max_value, sizes=list(sizes))
    marker = os.path.join(root, "data", "guess_number.json")
    if read_marker(marker) != data_args:
        make_guess_number(
            rl_path, n_train=n_train, n_test=n_test, seed=seed, max_value=max_value, sizes=sizes
        )
        train_ranges, _ = split_ranges(max_value, sizes, TEST_FRACTION, seed)
        make_guess_number_sft(sft_path, n_dialogues=n_sft, ranges=train_ranges, seed=seed + 2)
        with open(marker, "w") as f:
            json.dump(data_args, f, indent=2)
    return {"model_path": model_path, "sft_path": sft_path, "rl_path": rl_path}
