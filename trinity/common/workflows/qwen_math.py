"""Workflows prompting as the Qwen2.5-Math evaluation does, after the original Trinity-RFT:
``math_eval_workflow`` (evaluation), ``on_policy_distill_workflow`` and
``on_policy_distill_math_workflow`` (on-policy distillation).

The Qwen2.5-Math prompt is the system message "You are a helpful assistant." and the
question (the ``format.prompt_key`` column) followed by ``BOXED_PROMPT`` on a new line.
Answers are checked by ``qwen_math_correct`` (trinity/common/rewards/qwen_math.py).

On-policy distillation here scores the student's samples with the teacher in the trainer
(``algorithm_type: on_policy_distill``, the teacher being ``explorer.auxiliary_models[0]``),
not in the workflow as the original did: the workflows only sample, and their reward (0, or
the answer's accuracy) is what the metrics show.
"""

from __future__ import annotations

from typing import Any, Dict, List

from trinity.common.experience import Experience
from trinity.common.rewards.qwen_math import qwen_math_correct
from trinity.common.workflows.boxed import BOXED_PROMPT
from trinity.common.workflows.simple import PromptWorkflow, build_messages
from trinity.common.workflows.workflow import WORKFLOWS, Task

QWEN_SYSTEM = "You are a helpful assistant."


def qwen_math_messages(task: Task) -> List[Dict[str, Any]]:
    """The Qwen2.5-Math evaluation prompt for the task's question."""
    question = build_messages(task)[-1]["content"]
    return [
        {"role": "system", "content": QWEN_SYSTEM},
        {"role": "user", "content": f"{question}\n{BOXED_PROMPT}"},
    ]


def score_accuracy(answers: List[Experience], truth: Any) -> List[Experience]:
    """Each answer's reward and ``accuracy`` metric: 1.0 when it agrees with the truth."""
    for exp in answers:
        exp.reward = float(qwen_math_correct(exp.response_text or "", truth))
        exp.metrics["accuracy"] = exp.reward
    return answers


@WORKFLOWS.register_module("async_math_eval_workflow")  # the same: see simple_workflow
@WORKFLOWS.register_module("math_eval_workflow")
class MathEvalWorkflow(PromptWorkflow):
    """Qwen2.5-Math's evaluation: its prompt, temperature 0.6 and top-p 0.8 whatever the
    taskset's ``rollout_args`` say (as in the original), ``rollout_args.n`` answers."""

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        return qwen_math_messages(task)

    def run(self) -> List[Experience]:
        args = self.task.rollout_args
        answers = self.model.chat(
            self.messages, n=args.n, temperature=0.6, top_p=0.8, max_tokens=args.max_tokens
        )
        return score_accuracy(answers, self.truth)


@WORKFLOWS.register_module("on_policy_distill_workflow")
class OnPolicyDistillWorkflow(PromptWorkflow):
    """Samples the student's answers to the taskset's prompt; the trainer's teacher scores
    them (reward 0: the advantage comes from the teacher's logprobs)."""

    def run(self) -> List[Experience]:
        answers = self.sample()
        for exp in answers:
            exp.reward = 0.0
        return answers


@WORKFLOWS.register_module("on_policy_distill_math_workflow")
class OnPolicyDistillMathWorkflow(OnPolicyDistillWorkflow):
    """The same with the Qwen2.5-Math prompt; the reward is the answer's accuracy."""

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        return qwen_math_messages(task)

    def run(self) -> List[Experience]:
        return score_accuracy(self.sample(), self.truth)
