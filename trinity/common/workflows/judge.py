"""``llm_judge_workflow``: answers scored by an auxiliary model acting as judge.

The policy answers the taskset's prompt (``rollout_args.n`` samples, as ``math_workflow``);
``auxiliary_models[0]`` (``explorer.auxiliary_models[0]``, an ``openai.OpenAI`` as the
developer guide gives it) reads each answer with the reference and replies; the reward is 1.0
when its reply starts with "yes" (case and spaces ignored), else 0.0. ``workflow_args``:

- ``judge_prompt``: the judge's user message, formatted with ``{question}``, ``{answer}`` and
  ``{reference}`` (default below);
- ``judge_max_tokens``: the length of the judge's reply (default 8).

The judge samples greedily, so a given answer always gets the same verdict.
"""

from __future__ import annotations

from typing import Any, List, Optional

from trinity.common.experience import Experience
from trinity.common.workflows.simple import build_messages
from trinity.common.workflows.workflow import WORKFLOWS, Task, Workflow

JUDGE_PROMPT = (
    "Question: {question}\nReference answer: {reference}\nStudent answer: {answer}\n"
    "Is the student answer correct? Reply yes or no."
)


@WORKFLOWS.register_module("llm_judge_workflow")
class LLMJudgeWorkflow(Workflow):
    """The policy answers; the first auxiliary model judges each answer against the reference."""

    def __init__(self, model: Any, task: Task, auxiliary_models: Optional[List] = None) -> None:
        super().__init__(model, task, auxiliary_models)
        if not auxiliary_models:
            raise ValueError(
                "llm_judge_workflow needs a judge: set explorer.auxiliary_models to at least one "
                "model (the first one judges)"
            )
        self.reset(task)

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task
        self.messages = build_messages(task)
        self.reference = task.raw_task.get(task.format_args.response_key)
        self.judge_prompt = task.workflow_args.get("judge_prompt", JUDGE_PROMPT)
        self.judge_max_tokens = int(task.workflow_args.get("judge_max_tokens", 8))

    def run(self) -> List[Experience]:
        args = self.task.rollout_args
        answers = self.model.chat(
            self.messages,
            n=args.n,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
        )
        for exp in answers:
            verdict = self._judge(exp.response_text)
            exp.reward = float(verdict.strip().lower().startswith("yes"))
            exp.metrics["accuracy"] = exp.reward
            exp.info["judge_reply"] = verdict
        return answers

    def _judge(self, answer: str) -> str:
        judge = self.auxiliary_models[0]
        question = self.messages[-1]["content"]
        prompt = self.judge_prompt.format(
            question=question, answer=answer, reference=self.reference
        )
        reply = judge.chat.completions.create(
            model=judge.model_path,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=self.judge_max_tokens,
        )
        return reply.choices[0].message.content or ""
