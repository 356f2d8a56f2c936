"""GSPO: PPO's clipped surrogate on a sequence-level importance ratio (arXiv 2507.18071)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.policy_loss_fn.ppo import PPOPolicyLossFn
from trinity.algorithm.utils import masked_mean


@POLICY_LOSS_FN.register_module("gspo")
class GSPOPolicyLossFn(PolicyLossFn):
    """Clipped surrogate with ``s_i = exp(mean_t(logprob - old_logprob))`` per sequence.

    Every action token of row ``i`` uses the ratio ``sg(s_i) * exp(logprob - sg(logprob))``
    (the paper's GSPO-token form): its value is ``s_i``, its gradient is ``s_i`` times the
    token's own score, so with equal advantages along a row it matches sequence-level GSPO.
    The surrogate itself is ``PPOPolicyLossFn`` applied to that ratio.

    Args:
        clip_range_low / clip_range_high: clip ``s_i`` to ``[1 - low, 1 + high]``. The paper's
            defaults (3e-4, 4e-4) are tiny because a length-normalised ratio moves little.
        loss_agg_mode: ``"seq-mean-token-mean"`` (the paper's per-sequence average).
    """

    def __init__(
        self,
        clip_range_low: float = 3e-4,
        clip_range_high: float = 4e-4,
        loss_agg_mode: str = "seq-mean-token-mean",
    ) -> None:
        super().__init__(loss_agg_mode)
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
        self.surrogate = PPOPolicyLossFn(
            clip_range_low=clip_range_low,
            clip_range_high=clip_range_high,
            loss_agg_mode=loss_agg_mode,
        )

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``. Metrics: ``pg_loss``, ``pg_clipfrac`` (share of action
        tokens whose clipped term was taken) and ``ppo_kl`` (token-level, as for PPO).
        ``rollout_is_weights``: as for PPO."""
        log_ratio = logprob - old_logprob
        seq_log_ratio = masked_mean(log_ratio, action_mask, dim=-1).unsqueeze(-1)
        # Value log s_i on every token; gradient d logprob only (the GSPO-token form).
        token_log_ratio = seq_log_ratio.detach() + logprob - logprob.detach()
        loss, metrics = self.surrogate(
            logprob=token_log_ratio,
            old_logprob=torch.zeros_like(logprob),
            action_mask=action_mask,
            advantages=advantages,
            rollout_is_weights=rollout_is_weights,
        )
        metrics["ppo_kl"] = masked_mean(-log_ratio, action_mask).item()
        return loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {
            "clip_range_low": 3e-4,
            "clip_range_high": 4e-4,
            "loss_agg_mode": "seq-mean-token-mean",
        }
