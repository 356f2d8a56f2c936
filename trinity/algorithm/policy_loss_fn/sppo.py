"""sPPO: PPO's surrogate on the log of the clipped ratio (Vaswani et al. 2022, arXiv:2108.05828)."""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


@POLICY_LOSS_FN.register_module("sppo")
class SPPOPolicyLossFn(PolicyLossFn):
    """``agg(-A * log clip(r, 1 / (1 + epsilon), 1 + epsilon))``, ``r = exp(logprob - old)``.

    The sPPO ("softmax PPO") surrogate of Vaswani et al. 2022, "A general class of surrogate
    functions for stable and efficient reinforcement learning" (AISTATS, arXiv:2108.05828):
    functional mirror ascent on the logits of a softmax policy turns PPO's ``r * A`` into
    ``log(r) * A``, and its clipping into a symmetric clip of ``log r`` to
    ``[-log(1 + epsilon), log(1 + epsilon)]``. Inside that range a token's gradient is
    ``A * grad log pi`` (REINFORCE, no importance weight); outside it is 0, whatever the
    advantage's sign.

    Args:
        epsilon: the clip, ``|log r| <= log(1 + epsilon)``.
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.
    """

    def __init__(self, epsilon: float = 0.3, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)
        if not epsilon > 0.0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        self.bound = math.log1p(epsilon)

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``. Metrics: ``pg_loss``, ``pg_clipfrac`` (share of valid tokens
        outside the clip) and ``ppo_kl``. ``rollout_is_weights``: as for PPO."""
        log_ratio = logprob - old_logprob
        clipped = log_ratio.clamp(-self.bound, self.bound)  # no gradient where it clips
        pg_loss = aggregate_loss(
            -advantages * clipped, action_mask, self.loss_agg_mode, weights=rollout_is_weights
        )
        outside = (log_ratio.detach().abs() > self.bound).float()
        metrics = {
            "pg_loss": pg_loss.item(),
            "pg_clipfrac": masked_mean(outside, action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio.detach(), action_mask).item(),
        }
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"epsilon": 0.3, "loss_agg_mode": "token-mean"}
