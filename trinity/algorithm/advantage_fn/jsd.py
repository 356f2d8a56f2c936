"""On-policy distillation by the generalized Jensen-Shannon divergence (GKD, arXiv:2306.13649).

The student samples, the teacher scores each sampled token, and the per-token advantage is
the policy gradient of the generalized JSD between the two token distributions.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn, advantage_metrics
from trinity.common.experience import ExperienceBatch


def log_mixture_ratio(log_ratio: torch.Tensor, beta: float) -> torch.Tensor:
    """``log(M / Q) = log(beta * P / Q + 1 - beta)`` from ``log_ratio = log P - log Q``,
    computed without overflow (``logaddexp``). Shape as given."""
    rest = torch.full_like(log_ratio, math.log1p(-beta))
    return torch.logaddexp(log_ratio + math.log(beta), rest)


def jsd_advantages(
    teacher_logprob: torch.Tensor, student_logprob: torch.Tensor, beta: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(advantage, JSD estimate)``, both ``(B, R)``, on tokens the student sampled.

    With ``P`` the teacher's and ``Q`` the student's token distribution and
    ``M = beta P + (1 - beta) Q``, GKD's generalized JSD is
    ``JSD(beta) = beta KL(P || M) + (1 - beta) KL(Q || M)``. Its gradient in the student's
    probabilities is ``dJSD/dQ(y) = (1 - beta) log(Q(y) / M(y))`` (the other terms cancel),
    so ``grad JSD = E_{y~Q}[(1 - beta) log(Q(y)/M(y)) grad log Q(y)]``: a policy gradient
    with advantage ``(1 - beta) log(M(y) / Q(y))`` on the sampled token. ``beta -> 1``
    divided by ``1 - beta`` is the reverse-KL advantage ``log P - log Q`` of
    ``on_policy_distill``; ``beta -> 0`` divided by ``beta`` is the forward-KL one,
    ``P/Q - 1``.

    The estimate is ``beta (P/Q) log(P/M) + (1 - beta) log(Q/M)`` at the sampled token,
    unbiased for ``JSD(beta)`` when tokens are drawn from ``Q``.

    Args:
        teacher_logprob: ``(B, R)`` ``log P`` of the sampled tokens.
        student_logprob: ``(B, R)`` ``log Q`` of them when sampled (the rollout's).
        beta: GKD's ``beta``, in (0, 1).
    """
    log_ratio = teacher_logprob - student_logprob  # log P/Q
    log_m_over_q = log_mixture_ratio(log_ratio, beta)
    advantage = (1.0 - beta) * log_m_over_q
    # (P/Q) log(P/M) = e^x (x - log M/Q); exp of a clamped x keeps a token the student found
    # near-impossible (padding: both logprobs 0) from overflowing
    estimate = beta * torch.exp(log_ratio.clamp(max=30.0)) * (log_ratio - log_m_over_q)
    return advantage, estimate - (1.0 - beta) * log_m_over_q


@ADVANTAGE_FN.register_module("jsd")
class JSDAdvantageFn(AdvantageFn):
    """``kl_coef * (1 - beta) * log(M / Q)`` per sampled token (``jsd_advantages``).

    The generalized JSD of Agarwal et al. 2024, "On-Policy Distillation of Language Models:
    Learning from Self-Generated Mistakes" (GKD, arXiv:2306.13649; ``JSD(beta)`` is its Eq. 1,
    averaged over the sequence's tokens as in Eq. 2), between the teacher's and the student's
    next-token distributions, on the student's own samples (the GKD objective of section 3.1
    with student-data fraction ``lambda = 1``). GKD sums the divergence over the whole
    vocabulary; the trainer scores only the sampled token under the teacher
    (``teacher_logprob``, as for ``on_policy_distill``), so here the divergence enters as
    its policy gradient on the sampled tokens, a one-sample estimate of the full-vocabulary
    gradient. Reads ``exps.extra["teacher_logprob"]`` and ``exps.old_logprob``; returns
    equal advantages.

    Args:
        lambda_coef: GKD's ``beta`` in (0, 1), the weight of ``KL(P || M)``; near 0 the
            divergence behaves like the forward KL, near 1 like the reverse KL; 0.5 is the
            symmetric JSD.
        kl_coef: scales the advantage.
    """

    def __init__(self, lambda_coef: float = 0.5, kl_coef: float = 1.0) -> None:
        if not 0.0 < lambda_coef < 1.0:
            raise ValueError(
                f"lambda_coef (GKD's beta) must be in (0, 1): at 0 or 1 the generalized JSD is "
                f"0 whatever the student; got {lambda_coef}"
            )
        self.lambda_coef, self.kl_coef = lambda_coef, kl_coef

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        if "teacher_logprob" not in exps.extra:
            raise ValueError(
                "jsd needs teacher logprobs: use algorithm_type jsd with the teacher as "
                "explorer.auxiliary_models[0]"
            )
        advantage, estimate = jsd_advantages(
            exps.extra["teacher_logprob"], exps.old_logprob, self.lambda_coef
        )
        exps.advantages = self.kl_coef * advantage * exps.action_mask
        exps.returns = exps.advantages.clone()
        metrics = advantage_metrics(exps)
        tokens = exps.action_mask.sum().clamp(min=1.0)
        metrics["distill/jsd"] = float((estimate * exps.action_mask).sum() / tokens)
        return exps, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"lambda_coef": 0.5, "kl_coef": 1.0}
