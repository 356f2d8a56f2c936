"""``ruler_workflow``: RULER, one judge call ranks all of a task's answers relative to each other.

RULER (OpenPipe's "Relative Universal LLM-Elicited Rewards") asks an LLM judge to score a
whole group of rollouts of one task together, in one call: a judge compares far more
reliably than it grades on an absolute scale, and group-based advantages (GRPO, RLOO, ...)
only use the differences within a group anyway. The policy samples ``rollout_args.n``
answers; ``auxiliary_models[0]`` gets them numbered in ``workflow_args.judge_prompt`` and
replies one ``k: score`` line per answer (scores 0 to ``max_score``); the scores are scaled
to ``[0, 1]`` within the group (``normalise_group``) and become the rewards.

It is a workflow rather than a reward function because a reward function scores one
response at a time and is given no model, while this judge needs the group's answers
together and a model to ask (docs/design-notes.md, "LLM judges"). It therefore needs every
answer of a task in one workflow run: ``explorer.max_repeat_times_per_runner`` must not
split the group (checked before start).
"""

from __future__ import annotations

from typing import List

from pydantic import Field, field_validator

from trinity.common.experience import Experience
from trinity.common.workflows.judging import (
    JudgedWorkflow,
    JudgeReplyError,
    ScoreArgs,
    check_template,
    normalise_group,
    parse_ruler_scores,
)
from trinity.common.workflows.workflow import WORKFLOWS

RULER_PROMPT = (
    "Several answers to one question follow. Compare them and score each from 0 to "
    "{max_score}: a better answer gets a higher score.\nQuestion: {question}\nAnswers:\n"
    "{answers}\nReply with one line per answer, number: score (e.g. 1: 7)."
)


class RulerArgs(ScoreArgs):
    """``workflow_args`` of ``ruler_workflow``."""

    judge_prompt: str = Field(
        RULER_PROMPT,
        description="The judge's message: {answers} is the answers as numbered lines "
        "('1) ...'); {question}, {reference}, {n} and {max_score} may be used. The reply "
        "must hold one 'k: score' line per answer.",
    )
    judge_max_tokens: int = Field(
        64, ge=1, description="Tokens the judge may reply with: a line per answer."
    )

    @field_validator("judge_prompt")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        return check_template(
            value, ("question", "reference", "answers", "n", "max_score"), ("answers",)
        )


@WORKFLOWS.register_module("ruler_workflow")
class RulerWorkflow(JudgedWorkflow):
    """The policy answers; one judge call scores all the answers relative to each other."""

    args_model = RulerArgs
    judges_whole_group = True  # the config check keeps a task's answers in one run

    def run(self) -> List[Experience]:
        answers = self.sample()
        max_score = self.args.max_score
        prompt = self.args.judge_prompt.format(
            question=self.question,
            reference=self.truth,
            answers="\n".join(f"{k}) {exp.response_text}" for k, exp in enumerate(answers, 1)),
            n=len(answers),
            max_score=f"{max_score:g}",
        )
        reply = self.ask_judge(prompt)
        try:
            scores = parse_ruler_scores(reply, len(answers), max_score)
        except JudgeReplyError as exc:
            raise self.unreadable(exc) from None
        for exp, score, reward in zip(answers, scores, normalise_group(scores), strict=True):
            exp.reward = reward
            exp.metrics["judge_score"] = score / max_score
            exp.info["judge_reply"] = reply
        return answers
