"""TOPR: tapered off-policy REINFORCE (Le Roux et al., 2025, arXiv:2503.14286)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


@POLICY_LOSS_FN.register_module("topr")
class TOPRPolicyLossFn(PolicyLossFn):
    """``agg(-sg(w) * A * logprob)`` with ``w = 1`` on a sequence whose advantage is >= 0 and
    ``w = clip(pi(y)/mu(y), 0, 1)`` on one whose advantage is < 0.

    This is the TOPR update of the paper's Section 3 (the gradient written ``grad J_topr``):
    positive examples take plain REINFORCE (SFT-like, no importance weight), negative ones a
    truncated importance weight, so pushing down an unlikely wrong answer fades out instead
    of diverging. The ratio is the whole sequence's, ``exp(sum_t (logprob - old_logprob))``
    over its action tokens, as in the paper, where ``tau`` is the trajectory. The paper's
    ``R(tau)`` is a reward minus a constant baseline; here it is the advantage the
    ``advantage_fn`` gives (GRPO's group baseline by default for ``algorithm_type: topr``).

    Args:
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.
    """

    def __init__(self, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``; a sequence's advantage is that of its action tokens (the
        sign of their sum decides). Metrics: ``pg_loss``, ``tapered_frac`` (share of
        sequences with a weight below 1) and ``ppo_kl``. ``rollout_is_weights``: as for PPO."""
        mask = action_mask.to(logprob.dtype)
        log_ratio = (logprob - old_logprob).detach()
        # clip(exp(x), 0, 1) = exp(min(x, 0)): never overflows, however off-policy
        weight = torch.exp((log_ratio * mask).sum(-1).clamp(max=0.0))
        negative = (advantages * mask).sum(-1) < 0
        weight = torch.where(negative, weight, torch.ones_like(weight)).unsqueeze(-1)
        pg_loss = aggregate_loss(
            -weight * advantages * logprob,
            action_mask,
            self.loss_agg_mode,
            weights=rollout_is_weights,
        )
        metrics = {
            "pg_loss": pg_loss.item(),
            "tapered_frac": (weight.squeeze(-1) < 1).float().mean().item(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        }
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"loss_agg_mode": "token-mean"}
