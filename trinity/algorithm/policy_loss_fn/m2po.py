"""M2PO: a trust region on the second moment of the log importance ratios (arXiv:2510.01161)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


def second_moment_mask(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    m2_threshold: float,
) -> torch.Tensor:
    """The tokens M2PO keeps (the paper's Algorithm 1, section 5.2).

    Only tokens in the trust region's reach can be masked: those whose update would push
    the ratio further from 1 (``A > 0`` and ``r > 1``, or ``A < 0`` and ``r < 1``), the
    tokens PPO would clip. Among them, the ones with the largest ``(log r)^2`` are masked
    until the mean of the rest, ``M2``, is at most ``m2_threshold``: sorted ascending, the
    longest prefix whose mean stays within the bound is kept (prefix means only grow).

    Args:
        log_ratio: ``(B, R)`` ``log pi_theta - log pi_behaviour`` per token.
        advantages: ``(B, R)``.
        action_mask: ``(B, R)`` 1 on tokens that count.
        m2_threshold: the bound ``tau_M2`` on the kept tokens' mean squared log-ratio.

    Returns:
        ``(B, R)`` mask in ``action_mask``'s dtype: 1 on kept tokens, 0 on masked ones and
        on padding.
    """
    log_ratio, advantages = log_ratio.detach(), advantages.detach()
    valid = action_mask > 0
    reach = valid & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))
    values = log_ratio[reach].float().square()
    keep = valid.clone()
    if values.numel() and values.mean().item() > m2_threshold:
        ordered, order = torch.sort(values, stable=True)
        counts = torch.arange(1, len(ordered) + 1, dtype=ordered.dtype, device=ordered.device)
        kept = int(((ordered.cumsum(0) / counts) <= m2_threshold).sum())
        in_reach = torch.ones_like(values, dtype=torch.bool)
        in_reach[order[kept:]] = False
        keep[reach] = in_reach
    return keep.to(action_mask.dtype)


@POLICY_LOSS_FN.register_module("m2po")
class M2POPolicyLossFn(PolicyLossFn):
    """``agg(-M * A * r)`` with ``r = exp(logprob - old_logprob)`` and ``M`` the M2PO mask.

    This is Second-Moment Trust Policy Optimization (Zheng, Zhao and Chen 2025, "Prosperity
    before Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?",
    arXiv:2510.01161v2): its objective ``J = 1/sum|o_i| * sum_i sum_t M_it r_it A_it`` (Eq. 5,
    section 5.2; the ratio is not clipped), where the mask of its Algorithm 1
    (``second_moment_mask``) replaces PPO's clipping. On stale data clipping drops many
    high-entropy tokens, the informative ones; bounding the second moment
    ``M2 = mean (log r)^2`` of the batch (Eq. 4) drops only the extreme outliers. The mask is
    computed over the whole batch, as the paper's: ``batch_inputs`` gives it to the trainer,
    which scores the batch once per update at the current weights before the micro-batches.
    The denominator counts every valid token, masked or not (``token-mean``, the paper's
    footnote 2).

    Args:
        m2_threshold: ``tau_M2``, the bound on the kept trust-region tokens' mean squared
            log-ratio; the paper uses 0.04 in every experiment and finds it insensitive.
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``; the paper's is
            ``token-mean``.
    """

    def __init__(self, m2_threshold: float = 0.04, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)
        if not m2_threshold >= 0.0:
            raise ValueError(f"m2_threshold must be >= 0, got {m2_threshold}")
        self.m2_threshold = m2_threshold

    def batch_inputs(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs,
    ) -> Dict[str, torch.Tensor]:
        """``{"m2po_mask": (B, R)}`` from the whole batch's ``(B, R)`` tensors."""
        log_ratio = logprob - old_logprob
        mask = second_moment_mask(log_ratio, advantages, action_mask, self.m2_threshold)
        return {"m2po_mask": mask}

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        m2po_mask: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``; ``m2po_mask`` from ``batch_inputs``. Metrics: ``pg_loss``,
        ``m2po_masked_frac`` (masked tokens over valid ones) and ``ppo_kl``.
        ``rollout_is_weights``: as for PPO."""
        log_ratio = logprob - old_logprob
        # exp(+-20) stays finite, so a far off-policy token never makes inf * 0 = NaN
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        pg_loss = aggregate_loss(
            -advantages * ratio * m2po_mask,
            action_mask,
            self.loss_agg_mode,
            weights=rollout_is_weights,
        )
        metrics = {
            "pg_loss": pg_loss.item(),
            "m2po_masked_frac": masked_mean(1.0 - m2po_mask, action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio.detach(), action_mask).item(),
        }
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"m2_threshold": 0.04, "loss_agg_mode": "token-mean"}
