"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio (MiniMax-M1)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


@POLICY_LOSS_FN.register_module("cispo")
class CISPOPolicyLossFn(PolicyLossFn):
    """``agg(-sg(clip(r, 1 - low, 1 + high)) * A * logprob)``, ``r = exp(logprob - old)``.

    Unlike PPO, no token's gradient is dropped: clipping only bounds the weight of a token,
    so rare tokens with large ratios still get (bounded) updates.

    Args:
        clip_range_low: lower bound ``1 - low`` of the weight; None (the default) sets no
            lower bound, as MiniMax-M1 does ("we did not impose a lower bound on the IS
            weight"). Any value >= 1 is the same, since ratios are never negative.
        clip_range_high: upper bound ``1 + high``. MiniMax-M1 only says it tuned this
            bound; 0.28 is DAPO's clip-higher value, the common default of CISPO ports.
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``; MiniMax-M1 normalises
            by the total token count, i.e. ``"token-mean"``.
    """

    def __init__(
        self,
        clip_range_low: Optional[float] = None,
        clip_range_high: float = 0.28,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode)
        if clip_range_high < 0:
            raise ValueError(f"clip_range_high must be >= 0, got {clip_range_high}")
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``. Metrics: ``pg_loss``, ``is_clipfrac`` (share of action
        tokens whose weight was clipped) and ``ppo_kl``. ``rollout_is_weights``: as for PPO."""
        log_ratio = logprob - old_logprob
        # Same overflow guard as PPO: exp(+-20) stays finite, so padding never makes NaN.
        ratio = torch.exp(log_ratio.detach().clamp(-20.0, 20.0))
        low = None if self.clip_range_low is None else 1.0 - self.clip_range_low
        weight = ratio.clamp(min=low, max=1.0 + self.clip_range_high)
        pg_losses = -weight * advantages * logprob
        pg_loss = aggregate_loss(
            pg_losses, action_mask, self.loss_agg_mode, weights=rollout_is_weights
        )
        metrics = {
            "pg_loss": pg_loss.item(),
            "is_clipfrac": masked_mean((weight != ratio).float(), action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        }
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"clip_range_low": None, "clip_range_high": 0.28, "loss_agg_mode": "token-mean"}
