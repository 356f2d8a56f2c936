"""``rubric_workflow``: rubric as reward, a judge scores each answer on each listed criterion.

``workflow_args.rubric`` lists the criteria (``name``, ``description``, ``weight``); for every
answer and criterion ``auxiliary_models[0]`` reads ``judge_prompt`` and replies with a score
from 0 to ``max_score``. The reward is the weighted sum of the scores scaled to ``[0, 1]``:
``sum_c weight_c * score_c / max_score`` (weights summing to 1 keep it in ``[0, 1]``); each
criterion's scaled score is a metric (``rubric/<name>``). A workflow for the reason
``ruler_workflow`` is one: a reward function is given no model to ask.
"""

from __future__ import annotations

from typing import Dict, List

from pydantic import Field, field_validator

from trinity.common.config.base import ConfigModel, repeated
from trinity.common.experience import Experience
from trinity.common.workflows.judging import (
    JudgedWorkflow,
    JudgeReplyError,
    ScoreArgs,
    check_template,
    parse_score,
)
from trinity.common.workflows.workflow import WORKFLOWS

RUBRIC_PROMPT = (
    "Score an answer on one criterion, from 0 to {max_score}.\nQuestion: {question}\n"
    "Reference answer: {reference}\nAnswer: {answer}\nCriterion: {criterion}\n"
    "Reply with the score only."
)


class Criterion(ConfigModel):
    """One criterion of ``workflow_args.rubric``."""

    name: str = Field(description="Its metric's name (rubric/<name>); unique in the rubric.")
    description: str = Field(description="What the judge checks; fills {criterion}.")
    weight: float = Field(1.0, ge=0, description="Its weight in the reward's sum.")


class RubricArgs(ScoreArgs):
    """``workflow_args`` of ``rubric_workflow``."""

    rubric: List[Criterion] = Field(
        min_length=1, description="The criteria each answer is scored on."
    )
    judge_prompt: str = Field(
        RUBRIC_PROMPT,
        description="The judge's message per answer and criterion: {answer} and {criterion} "
        "(the description); {question}, {reference} and {max_score} may be used. The reply "
        "must be the score alone.",
    )
    judge_max_tokens: int = Field(8, ge=1, description="Tokens the judge may reply with: a score.")

    @field_validator("judge_prompt")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        known = ("question", "reference", "answer", "criterion", "max_score")
        return check_template(value, known, ("answer", "criterion"))

    @field_validator("rubric")
    @classmethod
    def _unique_names(cls, value: List[Criterion]) -> List[Criterion]:
        twice = repeated([c.name for c in value])
        if twice:
            raise ValueError(f"criterion name '{twice[0]}' is used twice; names must be unique")
        return value


def rubric_reward(scores: Dict[str, float], rubric: List[Criterion], max_score: float) -> float:
    """``sum_c weight_c * scores[c] / max_score`` over the rubric's criteria."""
    return sum(c.weight * scores[c.name] / max_score for c in rubric)


@WORKFLOWS.register_module("rubric_workflow")
class RubricWorkflow(JudgedWorkflow):
    """The policy answers; the judge scores each answer on each criterion of the rubric."""

    args_model = RubricArgs

    def run(self) -> List[Experience]:
        answers = self.sample()
        rubric, max_score = self.args.rubric, self.args.max_score
        for exp in answers:
            replies = {c.name: self.ask_judge(self._prompt(exp, c)) for c in rubric}
            try:
                scores = {name: parse_score(r, max_score) for name, r in replies.items()}
            except JudgeReplyError as exc:
                raise self.unreadable(exc) from None
            exp.reward = rubric_reward(scores, rubric, max_score)
            exp.metrics.update({f"rubric/{n}": s / max_score for n, s in scores.items()})
            exp.info["judge_replies"] = replies
        return answers

    def _prompt(self, exp: Experience, criterion: Criterion) -> str:
        return self.args.judge_prompt.format(
            question=self.question,
            reference=self.truth,
            answer=exp.response_text,
            criterion=criterion.description,
            max_score=f"{self.args.max_score:g}",
        )
