"""PPO's clipped surrogate loss, with asymmetric clipping and optional dual-clip."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


@POLICY_LOSS_FN.register_module("ppo")
class PPOPolicyLossFn(PolicyLossFn):
    """``max(-A * r, -A * clip(r, 1 - low, 1 + high))`` per token, ``r = exp(logprob - old)``.

    Args:
        clip_range: symmetric clip (veRL ``clip_ratio``).
        clip_range_low / clip_range_high: override either side (DAPO's clip-higher).
        clip_ratio_c: dual-clip bound (> 1) for negative advantages: the loss of a token with
            ``A < 0`` is capped at ``-A * clip_ratio_c`` (veRL uses 3.0). None disables it.
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.
    """

    def __init__(
        self,
        clip_range: float = 0.2,
        clip_range_low: Optional[float] = None,
        clip_range_high: Optional[float] = None,
        clip_ratio_c: Optional[float] = None,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(loss_agg_mode)
        self.clip_range_low = clip_range if clip_range_low is None else clip_range_low
        self.clip_range_high = clip_range if clip_range_high is None else clip_range_high
        if clip_ratio_c is not None and clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1.0 (or None to disable), got {clip_ratio_c}")
        self.clip_ratio_c = clip_ratio_c

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``; returns the aggregated loss and its metrics.
        ``rollout_is_weights`` (detached, from ``algorithm.rollout_correction``) multiply
        each token's term; None leaves them alone."""
        log_ratio = logprob - old_logprob
        # A huge log-ratio would overflow exp() to inf (and inf * 0 = NaN on padding); veRL
        # clamps at +-20 as well.
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.clip_range_low, 1.0 + self.clip_range_high)
        pg_losses = torch.maximum(unclipped, clipped)
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        }
        if self.clip_ratio_c is not None:
            capped = -advantages * self.clip_ratio_c
            negative = advantages < 0
            lower = (pg_losses > capped) & negative
            metrics["pg_clipfrac_lower"] = masked_mean(lower.float(), action_mask).item()
            pg_losses = torch.where(negative, torch.minimum(pg_losses, capped), pg_losses)
        pg_loss = aggregate_loss(
            pg_losses, action_mask, self.loss_agg_mode, weights=rollout_is_weights
        )
        metrics["pg_loss"] = pg_loss.item()
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"clip_range": 0.2, "clip_ratio_c": None, "loss_agg_mode": "token-mean"}
