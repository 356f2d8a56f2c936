"""What the LLM-judge workflows share: the policy's answers, the judge call, reading its reply.

``JudgedWorkflow`` samples ``rollout_args.n`` answers to the task's prompt and asks
``auxiliary_models[0]`` (an ``openai.OpenAI``) for verdicts; each subclass declares its
``workflow_args`` as a ``ConfigModel`` (``args_model``), checked before start with the key's
full path. A judge reply that cannot be read as the scores asked for raises
``JudgeReplyError``: the task fails and the runner retries it (``explorer.max_retry_times``);
an unreadable verdict is never turned into a reward of 0, except by the original
Trinity-RFT's judges, which keep its rule under its names (``math_ruler.py``,
``math_trainable_ruler.py``, ``rubric_judge.py``).
"""

from __future__ import annotations

import json
import re
import string
from typing import Any, Collection, List, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel
from trinity.common.workflows.simple import PromptWorkflow
from trinity.common.workflows.workflow import Task, read_workflow_args

_NUMBER = r"\d+(?:\.\d+)?"
# One RULER line: "3: 7", "answer 3: 7.5", "#3 = 7"; explanations on other lines are skipped.
_RULER_LINE = re.compile(rf"^\s*(?:answer\s*)?#?(\d+)\s*[:=]\s*({_NUMBER})\s*$", re.I | re.M)
# A lone score: "7", "7.5", "7/10", "7." (a rubric verdict).
_SCORE = re.compile(rf"^\s*({_NUMBER})\s*(?:/\s*{_NUMBER})?\s*\.?\s*$")


class JudgeReplyError(ValueError):
    """The judge's reply does not hold the scores asked for; the task is retried."""


class JudgeArgs(ConfigModel):
    """``workflow_args`` every judged workflow reads (each adds ``judge_max_tokens``, sized
    to the reply it asks for)."""

    judge_temperature: float = Field(
        0.0, ge=0, description="The judge's sampling temperature (0: greedy, one verdict)."
    )


class ScoreArgs(JudgeArgs):
    """``workflow_args`` of the judges that ask for scores on a scale."""

    max_score: float = Field(10.0, gt=0, description="Top of the judge's score scale.")


def check_template(template: str, known: Collection[str], required: Collection[str]) -> str:
    """``template`` if its ``{placeholders}`` are all ``known`` and include ``required``,
    else ``ValueError`` naming the one at fault (literal braces are written ``{{ }}``)."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        why = f"not a format string ({exc}); write literal braces as {{{{ }}}}"
        raise ValueError(why) from None
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(
            f"unknown placeholder {{{unknown[0]}}}; it may use {', '.join(sorted(known))}"
        )
    missing = sorted(set(required) - names)
    if missing:
        raise ValueError(f"needs the placeholder {{{missing[0]}}}")
    return template


def parse_ruler_scores(reply: str, n: int, max_score: float) -> List[float]:
    """The scores of answers ``1..n`` in a RULER reply: one ``k: score`` line per answer.

    Lines that are no such line (an explanation) are skipped; ``JudgeReplyError`` when an
    answer has no score or two, an answer number is not ``1..n``, or a score is above
    ``max_score``.
    """
    scores: dict = {}
    for index, value in _RULER_LINE.findall(reply):
        k = int(index)
        if not 1 <= k <= n or k in scores:
            why = "twice" if k in scores else f"but there are {n} answers"
            raise JudgeReplyError(f"answer {k} is scored {why}: {reply!r:.200}")
        scores[k] = float(value)
    missing = [k for k in range(1, n + 1) if k not in scores]
    if missing:
        raise JudgeReplyError(f"no 'k: score' line for answer {missing[0]} of {n}: {reply!r:.200}")
    return [in_range(scores[k], max_score, reply) for k in range(1, n + 1)]


def parse_score(reply: str, max_score: float) -> float:
    """The single score of a reply that is only a number (``7``, ``7.5``, ``7/10``)."""
    match = _SCORE.match(reply)
    if match is None:
        raise JudgeReplyError(f"expected a score only, got {reply!r:.200}")
    return in_range(float(match.group(1)), max_score, reply)


def in_range(score: float, max_score: float, reply: str, low: float = 0.0) -> float:
    if not low <= score <= max_score:
        raise JudgeReplyError(f"score {score:g} is outside {low:g}-{max_score:g}: {reply!r:.200}")
    return score


def fenced_json(reply: str) -> Any:
    """The JSON value of the reply's first ```json fence (else its first ``` fence), read up
    to the next ```; ``JudgeReplyError`` when there is no such fence or it holds no JSON."""
    opening = "```json" if "```json" in reply else "```"
    start = reply.find(opening)
    if start == -1:
        raise JudgeReplyError(f"no ``` fence: {reply!r:.200}")
    start += len(opening)
    end = reply.find("```", start)
    if end == -1:
        raise JudgeReplyError(f"the ``` fence is never closed: {reply!r:.200}")
    try:
        return json.loads(reply[start:end])
    except json.JSONDecodeError as exc:
        raise JudgeReplyError(f"the fence holds no JSON ({exc}): {reply!r:.200}") from None


def normalise_group(scores: List[float]) -> List[float]:
    """Scores of one group's answers scaled to ``[0, 1]`` within the group: the best gets 1,
    the worst 0 (RULER's scores are relative); a group of equal scores gets 0.5 each (no
    answer is better than another)."""
    low, high = min(scores), max(scores)
    if high == low:
        return [0.5] * len(scores)
    return [(s - low) / (high - low) for s in scores]


class JudgedWorkflow(PromptWorkflow):
    """The policy answers the task's prompt (``rollout_args.n`` samples, ``sample``); the first
    auxiliary model judges (a subclass whose policy judges itself sets ``needs_judge``
    False). Subclasses set ``args_model`` and write ``run``."""

    args_model: type = JudgeArgs
    needs_judge = True  # the config check asks for explorer.auxiliary_models

    def __init__(self, model: Any, task: Task, auxiliary_models: Optional[List] = None) -> None:
        if self.needs_judge and not auxiliary_models:
            raise ValueError(
                f"{type(self).__name__} needs a judge: set explorer.auxiliary_models to at "
                "least one model (the first one judges)"
            )
        super().__init__(model, task, auxiliary_models)

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.question = self.messages[-1]["content"]
        self.args = read_workflow_args(self.args_model, task)

    def ask_judge(self, prompt: str, system: Optional[str] = None) -> str:
        """The judge's reply to one user message (after ``system``, if given)."""
        judge = self.auxiliary_models[0]
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        limit = self.args.judge_max_tokens
        # No limit sent: the server gives the judge all the room left in its window.
        sized = {} if limit is None else {"max_tokens": limit}
        reply = judge.chat.completions.create(
            model=judge.model_path,
            messages=messages,
            temperature=self.args.judge_temperature,
            **sized,
        )
        return reply.choices[0].message.content or ""

    def unreadable(self, exc: JudgeReplyError) -> JudgeReplyError:
        """``exc`` prefixed with the task it failed, for the runner's report."""
        task = self.task
        return JudgeReplyError(
            f"taskset '{task.taskset_name}' row {task.index}: the judge's reply cannot be "
            f"read ({exc}); the task is retried, not scored 0"
        )
