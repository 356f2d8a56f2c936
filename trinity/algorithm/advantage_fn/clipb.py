"""Clip_B: GRPO advantages, and negative-advantage tokens whose entropy signal is an outlier
left out of the actor's loss (arXiv 2602.03392, "On the Entropy Dynamics in Reinforcement
Fine-Tuning of Large Language Models"; Trinity-RFT 0.5.2's ``clipb``)."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ACTOR_MASK_KEY,
    ADVANTAGE_FN,
    POLICY_ENTROPY_KEY,
    POLICY_LOGPROB_KEY,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import require_group_ids
from trinity.algorithm.advantage_fn.grpo import group_normalized_scores
from trinity.common.experience import ExperienceBatch

# Below this standard deviation of S every token is kept (the original's bound).
MIN_STD = 1e-12


def clipb_keep_mask(
    advantages: torch.Tensor,
    logprob: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    mu: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip_B's token filter.

    With ``p = exp(logprob)``, each token's signal is ``S = p * (entropy + logprob)``; ``ES``
    and ``varS`` are its mean and population variance (denominator ``n``) over the ``n``
    valid tokens of the whole batch. A token with a negative advantage is kept only if
    ``S - ES >= -mu * sqrt(varS)``; tokens with a positive or zero advantage are all kept,
    and so is every token when ``sqrt(varS) < MIN_STD``.

    Args:
        advantages: ``(B, R)``; only the sign is read.
        logprob: ``(B, R)`` each response token's logprob under the current policy.
        entropy: ``(B, R)`` the entropy of the policy's distribution at each token.
        mask: ``(B, R)`` 1 on valid (action) tokens, 0 elsewhere.
        mu: how many standard deviations of ``S`` below its mean a negative-advantage
            token may lie and stay.

    Returns:
        ``(B, R)`` the kept mask (``mask`` with the removed tokens set to 0, ``mask``'s
        dtype), and the scalars ``ES`` and ``varS`` (fp32).
    """
    valid = mask > 0
    signal = logprob.float().exp() * (entropy.float() + logprob.float())
    signal = torch.where(valid, signal, torch.zeros_like(signal))  # padding is no outlier
    n = valid.sum().clamp(min=1)
    mean = signal.sum() / n
    var = torch.where(valid, (signal - mean) ** 2, torch.zeros_like(signal)).sum() / n
    std = var.sqrt()
    if std.item() < MIN_STD:
        return mask.clone(), mean, var
    removed = (advantages < 0) & (signal - mean < -mu * std)
    return mask * (~removed).to(mask.dtype), mean, var


def clipb_fractions(
    advantages: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor
) -> Dict[str, float]:
    """The shares of tokens the filter removed: of all valid tokens (``frac_clipped``), of
    those with a positive (``frac_clipped_pos``) and a negative advantage
    (``frac_clipped_neg``); each 0 when there is no such token. ``advantages``, ``mask``
    (valid tokens) and ``kept`` (``clipb_keep_mask``'s) are ``(B, R)``."""
    valid = mask > 0
    removed = valid & ~(kept > 0)
    out = {}
    for name, where in (
        ("frac_clipped", valid),
        ("frac_clipped_pos", valid & (advantages > 0)),
        ("frac_clipped_neg", valid & (advantages < 0)),
    ):
        total = int(where.sum())
        out[name] = float((removed & where).sum()) / total if total else 0.0
    return out


@ADVANTAGE_FN.register_module("clipb")
class ClipBAdvantageFn(AdvantageFn):
    """GRPO's group advantages (a group of one: veRL's mean 0, std 1), broadcast over the
    action tokens; then ``clipb_keep_mask`` over the current policy's logprobs and
    entropies (``needs_policy_scores``: the trainer scores the batch before the update).

    The kept tokens go to ``exps.extra[ACTOR_MASK_KEY]``: the actor's loss (policy, KL and
    entropy terms, their aggregation, the ``actor/`` metrics and, without rollout
    correction, the engine/trainer mismatch metrics) counts only them, as the original's
    ``response_mask``. ``exps.action_mask``, so the advantage statistics, the batch
    metrics (response lengths) and a critic, keep every token; a removed token keeps its
    advantage. Metrics: ``advantage_metrics`` and ``clipb/`` ``frac_clipped``,
    ``frac_clipped_pos``, ``frac_clipped_neg`` (``clipb_fractions``), ``ES``, ``varS``.
    """

    needs_groups: bool = True
    needs_policy_scores: bool = True

    def __init__(self, epsilon: float = 1e-6, mu: float = 2.5) -> None:
        self.epsilon = epsilon
        self.mu = mu

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "clipb")
        missing = [k for k in (POLICY_LOGPROB_KEY, POLICY_ENTROPY_KEY) if k not in exps.extra]
        if missing:
            raise KeyError(
                f"the 'clipb' advantage reads the policy's {missing} in exps.extra, which the "
                "trainer sets for an advantage fn with needs_policy_scores"
            )
        seq_adv = group_normalized_scores(
            score_of(exps), exps.group_ids, self.epsilon, lone_rows_raw=True
        )
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        kept, mean, var = clipb_keep_mask(
            exps.advantages,
            exps.extra[POLICY_LOGPROB_KEY],
            exps.extra[POLICY_ENTROPY_KEY],
            exps.action_mask,
            self.mu,
        )
        exps.extra[ACTOR_MASK_KEY] = kept
        fractions = clipb_fractions(exps.advantages, exps.action_mask, kept)
        metrics = {f"clipb/{k}": v for k, v in fractions.items()}
        metrics.update({"clipb/ES": mean.item(), "clipb/varS": var.item()})
        return exps, {**advantage_metrics(exps), **metrics}

    @classmethod
    def default_args(cls) -> Dict:
        return {"epsilon": 1e-6, "mu": 2.5}
