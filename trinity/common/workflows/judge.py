"""``llm_judge_workflow``: answers scored by an auxiliary model acting as judge.

The policy answers the taskset's prompt (``rollout_args.n`` samples, as ``math_workflow``);
``auxiliary_models[0]`` (``explorer.auxiliary_models[0]``, an ``openai.OpenAI`` as the
developer guide gives it) reads each answer with the reference and replies; the reward is 1.0
when its reply starts with "yes" (case and spaces ignored), else 0.0 (a verdict, not a score
to parse: any other reply is a "no"). ``workflow_args`` (``LLMJudgeArgs``): ``judge_prompt``,
``judge_max_tokens``, ``judge_temperature``.

The judge samples greedily by default, so a given answer always gets the same verdict.
"""

from __future__ import annotations

from typing import List

from pydantic import Field, field_validator

from trinity.common.experience import Experience
from trinity.common.workflows.judging import JudgeArgs, JudgedWorkflow, check_template
from trinity.common.workflows.workflow import WORKFLOWS

JUDGE_PROMPT = (
    "Question: {question}\nReference answer: {reference}\nStudent answer: {answer}\n"
    "Is the student answer correct? Reply yes or no."
)


class LLMJudgeArgs(JudgeArgs):
    """``workflow_args`` of ``llm_judge_workflow``."""

    judge_prompt: str = Field(
        JUDGE_PROMPT,
        description="The judge's message per answer: {answer}; {question} and {reference} "
        "may be used. A reply starting with 'yes' is reward 1.",
    )
    judge_max_tokens: int = Field(8, ge=1, description="Tokens the judge may reply with.")

    @field_validator("judge_prompt")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        return check_template(value, ("question", "answer", "reference"), ("answer",))


@WORKFLOWS.register_module("llm_judge_workflow")
class LLMJudgeWorkflow(JudgedWorkflow):
    """The policy answers; the first auxiliary model judges each answer against the reference."""

    args_model = LLMJudgeArgs

    def run(self) -> List[Experience]:
        answers = self.sample()
        for exp in answers:
            verdict = self.ask_judge(
                self.args.judge_prompt.format(
                    question=self.question, answer=exp.response_text, reference=self.truth
                )
            )
            exp.reward = float(verdict.strip().lower().startswith("yes"))
            exp.metrics["accuracy"] = exp.reward
            exp.info["judge_reply"] = verdict
        return answers
