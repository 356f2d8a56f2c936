"""On-policy distillation: the teacher grades every token the student sampled.

The per-token advantage is the negative reverse-KL estimate
``log pi_teacher(y_t) - log pi_student(y_t)`` on the student's own samples, so a policy
gradient step moves the student toward the teacher where it sampled. No reward or group
is needed.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn, advantage_metrics
from trinity.common.experience import ExperienceBatch


def distill_advantages(
    teacher_logprob: torch.Tensor, student_logprob: torch.Tensor, action_mask: torch.Tensor
) -> torch.Tensor:
    """``(B, R)`` advantages ``teacher - student`` on action tokens, 0 elsewhere.

    Args:
        teacher_logprob: ``(B, R)`` teacher logprobs of the sampled tokens.
        student_logprob: ``(B, R)`` the student's logprobs when it sampled them (rollout).
        action_mask: ``(B, R)`` 1 on tokens the student generated.
    """
    return (teacher_logprob - student_logprob) * action_mask


@ADVANTAGE_FN.register_module("on_policy_distill")
class OnPolicyDistillAdvantageFn(AdvantageFn):
    """Reads ``exps.extra["teacher_logprob"]`` (filled by the trainer from the teacher model)
    and ``exps.old_logprob``; ``kl_coef`` scales the advantage; returns equal advantages."""

    def __init__(self, kl_coef: float = 1.0) -> None:
        self.kl_coef = kl_coef

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        if "teacher_logprob" not in exps.extra:
            raise ValueError(
                "on_policy_distill needs teacher logprobs: use algorithm_type on_policy_distill "
                "with the teacher as explorer.auxiliary_models[0]"
            )
        adv = distill_advantages(exps.extra["teacher_logprob"], exps.old_logprob, exps.action_mask)
        exps.advantages = self.kl_coef * adv
        exps.returns = exps.advantages.clone()
        metrics = advantage_metrics(exps)
        tokens = exps.action_mask.sum().clamp(min=1.0)
        metrics["distill/reverse_kl"] = float(-(adv.sum() / tokens))
        return exps, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"kl_coef": 1.0}
