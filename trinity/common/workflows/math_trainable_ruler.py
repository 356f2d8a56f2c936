"""``math_trainable_ruler_workflow``: the original Trinity-RFT's trainable RULER, where the
policy judges its own answers to a math problem and is trained on its judgments as well.

The answers are ``math_ruler_workflow``'s: the policy samples ``rollout_args.n`` of them (the
think/answer-tags system prompt when the taskset gives none and scores with ``math_reward``),
and the reward function's verdict is kept as metrics (its components and ``gold_reward``, their
sum). Each answer's gold score is scaled by ``(gold + 0.1) / 1.2``, the original's map of
``[-0.1, 1.1]`` (its math reward with a format bonus) onto ``[0, 1]``; this project's
``math_reward`` gives 0 or 1, so the scaled scores are 1/12 and 11/12.

The judge is the policy itself (``self.model``; no auxiliary model), shown
``math_ruler_workflow``'s judge prompt (``judge_prompts``) and sampled with the task's
``rollout_args``; each reply's last ``[s1, ..., sn]`` is read by ``parse_score_list``. A coin
says whether the task's ground truth counts as available (``ground_truth_probability`` in
``workflow_args``, 0.2 by default). The original drew it from numpy's global RNG;
here it is a ``random.Random`` seeded with the task's id (``train-<step>-<taskset>-<row>``;
the taskset and row outside an explorer), so one task draws the same coin on every attempt
and in every run, and a row draws anew at each step.

- Available: the answers' rewards are their gold rewards; the policy is asked the judge prompt
  ``n`` times, and each reply is an experience of its own, trained on like an answer (tokens
  and logprobs as the engine returned them), rewarded ``1 - mean |score - scaled gold|`` over
  the answers (0.0 when its list is unreadable), in a group of its own: ``group_id`` "/judge",
  which the runner appends to the task's id, so its advantages compare judgments with
  judgments. The answers and the judge replies are returned.
- Not available: the policy judges once (``n`` = 1) and each answer's reward is its mean score
  over the readable replies, so the one reply's score (0.0 when it is unreadable); only the
  answers are returned.

Metrics: ``judge_success``, the fraction of the task's judge replies that were read, on answers
and judge replies; ``reward_for_judge``, a judge reply's reward, on judge replies. The rewards
and the metric's name are the original's 0.5.2 (docs/design-notes.md: up to 0.5.0 a numpy error
left every judge reply's reward 0).
"""

from __future__ import annotations

import random
from statistics import fmean
from typing import List

from pydantic import Field

from trinity.common.config.base import ConfigModel
from trinity.common.experience import Experience
from trinity.common.workflows.math_ruler import (
    MathRulerWorkflow,
    judge_prompts,
    parse_score_list,
)
from trinity.common.workflows.workflow import WORKFLOWS

JUDGE_GROUP = "/judge"  # the judge replies' group_id: a suffix of the task's (the runner's rule)


def scaled_gold(gold_reward: float) -> float:
    """A gold reward in ``[-0.1, 1.1]`` as a score in ``[0, 1]``, the judge's scale."""
    return (gold_reward + 0.1) / 1.2


class MathTrainableRulerArgs(ConfigModel):
    """``workflow_args`` of ``math_trainable_ruler_workflow``."""

    ground_truth_probability: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Chance that a task's ground truth counts as available (answers rewarded "
        "by it, the policy's judgments trained), drawn per task, seeded by its id.",
    )


@WORKFLOWS.register_module("math_trainable_ruler_workflow")
class MathTrainableRulerWorkflow(MathRulerWorkflow):
    """The policy answers a math problem and judges its answers; with the ground truth
    available (a seeded coin) its judgments are trained too, as a group of their own."""

    args_model = MathTrainableRulerArgs
    needs_judge = False  # the policy judges; explorer.auxiliary_models is not used

    def ground_truth_available(self) -> bool:
        """The task's coin: ``random.Random`` seeds a ``str`` through SHA-512, so the draw is
        the same in every process (never ``hash``, salted per process)."""
        task = self.task
        seed = task.task_id or f"{task.taskset_name}-{task.index}"
        return random.Random(seed).random() < self.args.ground_truth_probability

    def run(self) -> List[Experience]:
        answers = self.gold_scored_answers()
        available = self.ground_truth_available()
        system, user = judge_prompts(self.question, [e.response_text or "" for e in answers])
        judging = self.sampling() | ({} if available else {"n": 1})
        replies = self.model.chat(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            **judging,
        )
        scores = [parse_score_list(r.response_text or "", len(answers)) for r in replies]
        read = [s for s in scores if s is not None]
        success = len(read) / len(replies)
        for exp in answers:
            exp.metrics["judge_success"] = success
        if not available:  # the answers are rewarded by the judgment; it is not trained
            (reply,) = replies
            for k, exp in enumerate(answers):
                exp.reward = fmean(s[k] for s in read) if read else 0.0
                exp.info["judge_reply"] = reply.response_text or ""
            return answers
        gold = [scaled_gold(exp.metrics["gold_reward"]) for exp in answers]
        for exp in answers:
            exp.reward = exp.metrics["gold_reward"]
        for reply, judged in zip(replies, scores, strict=True):
            if judged is None:  # unread: no reward for the judgment
                reply.reward = 0.0
            else:  # 1 - the mean absolute error against the scaled gold
                reply.reward = 1.0 - fmean(abs(s - g) for s, g in zip(judged, gold, strict=True))
            reply.metrics["judge_success"] = success
            reply.metrics["reward_for_judge"] = reply.reward
            reply.group_id = JUDGE_GROUP
        return answers + replies
