"""``math_ruler_workflow``: the original Trinity-RFT's RULER on math problems, one judge call
giving each of a task's answers an absolute score in ``[0, 1]``.

The policy answers the problem (``rollout_args.n`` samples). When the taskset gives no system
prompt and scores with ``math_reward`` (the default), the system prompt asks for the
reasoning in ``<think> </think>`` and the answer in ``<answer> </answer>`` tags, as the
original's math workflow did. The reward function's verdict against the truth is only
watched, not trained on: its components and their sum, ``gold_reward``, are the answer's
metrics. The reward is the judge's: ``auxiliary_models[0]`` gets one chat call, a system
message making it a fair judge of the N candidate solutions and a user message with the
question, the format asked for and the candidates numbered 1..N, and ends its reply with a
list ``[score 1, ..., score N]``. The last bracketed list of the reply is read
(``parse_score_list``), each score clipped to ``[0, 1]``; metric ``judge_success`` is 1.0.

Unlike ``ruler_workflow`` (ruler.py), the scores are not rescaled within the group, and a reply
without a readable list of N numbers is not retried: every answer gets 0.0 and
``judge_success`` 0.0, the original's rule, kept under its name (docs/design-notes.md, "What
the corpus's local configs needed"). ``async_math_ruler_workflow`` is the same workflow.
"""

from __future__ import annotations

import ast
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field

from trinity.common.experience import Experience
from trinity.common.rewards import total_reward
from trinity.common.workflows.judging import JudgeArgs, JudgedWorkflow
from trinity.common.workflows.simple import MathWorkflow, build_messages
from trinity.common.workflows.workflow import WORKFLOWS, Task

# The answer format the policy is asked for and the judge is told to expect.
TAGS_FORMAT = (
    "the reasoning first, inside <think> </think> tags, then the final answer, inside "
    "<answer> </answer> tags:\n<think> reasoning here </think>\n<answer> answer here </answer>"
)
THINK_ANSWER_PROMPT = (
    "The user asks a question and you, the assistant, solve it. Work out the reasoning before "
    f"answering, and write {TAGS_FORMAT}"
)
JUDGE_SYSTEM = (
    "You are an impartial judge. The user gives a question and {n} candidate solutions to it. "
    "Compare the solutions, judge how well each one resolves the question, and give each a "
    "score between 0 and 1."
)
JUDGE_USER = (
    "Here are a question and several candidate solutions to it.\n\nQuestion: {question}\n\n"
    "Required solution format: {format}\n\n{candidates}\n\n"
    "Score each candidate solution between 0 and 1 by how well it solves the question. You "
    "may compare them and reason step by step first, briefly. End your reply with the list "
    "of scores, in this form: [score for solution 1, score for solution 2, ..., score for "
    "solution {n}]"
)


def judge_prompts(question: str, answers: List[str]) -> Tuple[str, str]:
    """The judge's system message and user message for ``answers`` to ``question``."""
    candidates = "\n\n".join(
        f"Candidate solution {k}: {answer}" for k, answer in enumerate(answers, 1)
    )
    user = JUDGE_USER.format(
        question=question, format=TAGS_FORMAT, candidates=candidates, n=len(answers)
    )
    return JUDGE_SYSTEM.format(n=len(answers)), user


def parse_score_list(reply: str, n: int) -> Optional[List[float]]:
    """The ``n`` scores of the reply's last ``[...]`` (from its last ``[`` to its last ``]``),
    each clipped to ``[0, 1]``; None when there is no such list, it is no Python literal list
    of numbers, or it does not hold ``n`` of them."""
    start, end = reply.rfind("["), reply.rfind("]")
    if start == -1 or end < start:
        return None
    try:  # a literal only: the judge's text is never evaluated as code
        scores = ast.literal_eval(reply[start : end + 1])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(scores, list) or len(scores) != n:
        return None
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
        return None
    return [min(1.0, max(0.0, float(s))) for s in scores]


class MathRulerArgs(JudgeArgs):
    """``workflow_args`` of ``math_ruler_workflow``."""

    judge_max_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="Tokens the judge may reply with (it may reason before its list); unset: "
        "all the room left in the judge's max_model_len, as the original sent no limit.",
    )


@WORKFLOWS.register_module("async_math_ruler_workflow")  # the same: see simple_workflow
@WORKFLOWS.register_module("math_ruler_workflow")
class MathRulerWorkflow(JudgedWorkflow, MathWorkflow):
    """The policy answers a math problem; the reward function's score is a metric
    (``gold_reward``) and one judge call's scores in ``[0, 1]`` are the rewards."""

    args_model = MathRulerArgs
    judges_whole_group = True  # the config check keeps a task's answers in one run

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        messages = build_messages(task)
        default_reward = task.reward_fn in (None, self.default_reward_fn)
        plain = task.format_args.prompt_type == "plaintext"
        if default_reward and plain and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": THINK_ANSWER_PROMPT})
        return messages

    def gold_scored_answers(self) -> List[Experience]:
        """The policy's answers, each with the reward function's verdict as metrics: its
        components and their sum, ``gold_reward``."""
        answers = self.sample()
        for exp in answers:
            gold = self._score(exp)
            exp.metrics.update(gold)
            exp.metrics["gold_reward"] = total_reward(gold)
        return answers

    def run(self) -> List[Experience]:
        answers = self.gold_scored_answers()
        system, user = judge_prompts(self.question, [e.response_text or "" for e in answers])
        reply = self.ask_judge(user, system=system)
        scores = parse_score_list(reply, len(answers))
        for exp, score in zip(answers, scores or [0.0] * len(answers), strict=True):
            exp.reward = score
            exp.metrics["judge_success"] = float(scores is not None)
            exp.info["judge_reply"] = reply
        return answers
