"""The original Trinity-RFT's rubric judges: one holistic 1-10 rating of each answer.

``rubric_judge_workflow``: the policy answers the task (``rollout_args.n`` samples), the
conversation opening with ``POLICY_SYSTEM_PROMPT`` when the task gives no system prompt.
For each answer ``auxiliary_models[0]`` gets one call (``JUDGE_SYSTEM_PROMPT``, then
``JUDGE_USER_PROMPT`` with the task's prompt, the answer and the row's ``rubric`` column as
lines ``Rubric i (weight: w): description``, numbered from 0 as the original did) and replies
with a fenced JSON block ``{"rating": r}``, ``r`` from 1 to 10. The reward is ``r / 10``.
``rubric`` is a list of ``{description, weight}``; a row without one is judged on the line
``NO_RUBRICS``, with a warning.

A reply without a fenced ``rating`` in 1-10 scores 0.0 and the task goes on: the original's
rule, kept so its configs train as they did, where this project's own judges
(``rubric_workflow``, ``ruler_workflow``) fail the task to be retried. The metric
``judge_success``, on every answer, is the fraction of the task's answers whose rating was
read; ``info["judge_reply"]`` holds each reply (and ``info["judge_error"]`` why one failed).

``rubric_judge_openai_workflow``: the same judge at an outside OpenAI-compatible API that
``workflow_args`` name (``judge_model_name``; the API's URL and key in the environment
variables ``judge_api_base_url_env`` and ``judge_api_key_env``). No client is made here: the
config's derivation makes that API ``explorer.auxiliary_models[0]`` with ``engine_type:
external`` (``trinity/preflight/api_judge.py``), so its base-URL variable is checked before
start, handed on to the explorer and opened by each runner as for any external model.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional

from pydantic import Field, ValidationError

from trinity.common.config.schema_model import ExternalModelConfig
from trinity.common.experience import Experience
from trinity.common.workflows.judging import (
    JudgeArgs,
    JudgedWorkflow,
    JudgeReplyError,
    fenced_json,
    in_range,
)
from trinity.common.workflows.simple import with_default_system
from trinity.common.workflows.workflow import WORKFLOWS, Task

logger = logging.getLogger(__name__)

TOP_RATING = 10  # ratings run from 1 to TOP_RATING; the reward is rating / TOP_RATING

POLICY_SYSTEM_PROMPT = (
    "A conversation between a user and an assistant. The user asks a question and the "
    "assistant solves it: it first thinks the reasoning through in its mind, then gives the "
    "user the answer."
)
JUDGE_SYSTEM_PROMPT = (
    "You are an expert evaluator. You are given a user's prompt, a response to it and a list "
    "of quality rubrics, each with a weight. Rate the overall quality of the response from 1 "
    "to 10 by how well it satisfies the rubrics, judging them all together: a response that "
    "breaks several rubrics deserves a low rating, one that satisfies them all a high one.\n"
    "Begin your reply with a JSON object in a block that opens with ```json and closes with "
    '```. The object has a single key, "rating", whose value is an integer from 1 to 10. '
    'For example:\n```json\n{"rating": 7}\n```'
)
JUDGE_USER_PROMPT = (
    "Rate the overall quality of the response below from 1 to 10 by how well it satisfies "
    "the rubrics.\n<prompt>\n{prompt}\n</prompt>\n<response>\n{response}\n</response>\n"
    "<rubrics>\n{rubrics}\n</rubrics>\nYour rating as JSON:"
)
NO_RUBRICS = "No rubrics are given."


class RubricJudgeArgs(JudgeArgs):
    """``workflow_args`` of ``rubric_judge_workflow``."""

    judge_max_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="Tokens the judge may reply with; unset: as many as its server allows "
        "(the original set no limit).",
    )


class RubricJudgeAPIArgs(RubricJudgeArgs):
    """``workflow_args`` of ``rubric_judge_openai_workflow``: the judge's API."""

    judge_model_name: str = Field(description="The model name sent to the judge's API.")
    judge_api_base_url_env: str = Field(
        "OPENAI_BASE_URL", description="Environment variable holding the API's base URL."
    )
    judge_api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API's key."
    )


def rubric_lines(rubric: List[Mapping[str, Any]]) -> str:
    """The rubric as the judge reads it: ``Rubric i (weight: w): description`` lines, ``i``
    from 0; ``NO_RUBRICS`` for an empty one."""
    lines = [
        f"Rubric {i} (weight: {item['weight']}): {item['description']}"
        for i, item in enumerate(rubric)
    ]
    return "\n".join(lines) or NO_RUBRICS


def parse_rating(reply: str) -> float:
    """The ``rating`` of the reply's fenced JSON object: a number from 1 to ``TOP_RATING``."""
    value = fenced_json(reply)
    rating = value.get("rating") if isinstance(value, dict) else None
    if isinstance(rating, bool) or not isinstance(rating, (int, float)):
        raise JudgeReplyError(f'no number under "rating": {reply!r:.200}')
    return in_range(float(rating), TOP_RATING, reply, low=1)


def row_rubric(task: Task) -> List[Mapping[str, Any]]:
    """The row's ``rubric`` column: a list of ``{description, weight}`` (none: empty)."""
    rubric = task.raw_task.get("rubric") or []
    if not isinstance(rubric, list) or not all(
        isinstance(item, Mapping) and {"description", "weight"} <= item.keys() for item in rubric
    ):
        raise ValueError(
            f"taskset '{task.taskset_name}' row {task.index}: column 'rubric' must be a list of "
            f"{{description, weight}}, got {rubric!r:.200}"
        )
    return rubric


@WORKFLOWS.register_module("rubric_judge_workflow")
class RubricJudgeWorkflow(JudgedWorkflow):
    """The policy answers; the judge rates each answer 1-10 against the row's rubric."""

    args_model = RubricJudgeArgs

    def reset(self, task: Task) -> None:
        super().reset(task)
        rubric = row_rubric(task)
        if not rubric:
            logger.warning(
                "taskset '%s' row %s has no rubric: the judge rates its answers without one",
                task.taskset_name,
                task.index,
            )
        self.rubric = rubric_lines(rubric)

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        return with_default_system(super().prompt_messages(task), task, POLICY_SYSTEM_PROMPT)

    def run(self) -> List[Experience]:
        answers = self.sample()
        ratings = [self._rating(exp) for exp in answers]
        success = sum(r is not None for r in ratings) / max(len(answers), 1)
        for exp, rating in zip(answers, ratings, strict=True):
            exp.reward = 0.0 if rating is None else rating / TOP_RATING
            exp.metrics["judge_success"] = success
        return answers

    def _rating(self, exp: Experience) -> Optional[float]:
        """The judge's rating of one answer, None when its reply cannot be read."""
        prompt = JUDGE_USER_PROMPT.format(
            prompt=self.question, response=exp.response_text, rubrics=self.rubric
        )
        reply = self.ask_judge(prompt, system=JUDGE_SYSTEM_PROMPT)
        exp.info["judge_reply"] = reply
        try:
            return parse_rating(reply)
        except JudgeReplyError as exc:
            exp.info["judge_error"] = str(exc)
            task = self.task
            logger.warning(
                "taskset '%s' row %s: the judge's rating cannot be read, the answer scores 0 (%s)",
                task.taskset_name,
                task.index,
                exc,
            )
            return None


@WORKFLOWS.register_module("rubric_judge_openai_workflow")
class RubricJudgeAPIWorkflow(RubricJudgeWorkflow):
    """``rubric_judge_workflow`` whose judge is the outside API its ``workflow_args`` name."""

    args_model = RubricJudgeAPIArgs
    # The judge comes from workflow_args (api_judge), not from explorer.auxiliary_models.
    needs_judge = False

    @classmethod
    def api_judge(cls, workflow_args: Dict[str, Any]) -> Optional[ExternalModelConfig]:
        """The API that ``workflow_args`` name as the judge, as an ``external_model``
        section; None when they do not validate (the args check says why)."""
        try:
            args = RubricJudgeAPIArgs.model_validate(workflow_args)
        except ValidationError:
            return None
        return ExternalModelConfig(
            enable=True,
            model_name=args.judge_model_name,
            base_url_env=args.judge_api_base_url_env,
            api_key_env=args.judge_api_key_env,
        )
