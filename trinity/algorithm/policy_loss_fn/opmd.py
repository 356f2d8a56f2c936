"""OPMD (online policy mirror descent) policy loss, as in the developer guide's example."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss


@POLICY_LOSS_FN.register_module("opmd")
class OPMDPolicyLossFn(PolicyLossFn):
    """``agg(-advantages * logprob) / (1 + tau)``.

    The advantages (from the ``opmd`` advantage fn) already hold the mirror-descent target;
    the loss is a plain weighted log-likelihood, scaled by ``1 / (1 + tau)`` so the step
    size is regularised with respect to the current policy.

    Args:
        tau: OPMD's regularisation strength (must keep ``1 + tau > 0``).
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``. The guide's example
            uses a plain masked mean, i.e. ``"token-mean"``.
    """

    def __init__(self, tau: float = 1.0, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)
        if 1.0 + tau <= 0.0:
            raise ValueError(f"OPMD divides the loss by (1 + tau); tau must be > -1, got {tau}")
        self.tau = tau

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``. Metrics: ``opmd_loss`` (the guide's name) and the same value
        as ``pg_loss``, so progress displays that show ``actor/pg_loss`` keep working.
        ``rollout_is_weights``: as for PPO."""
        loss = aggregate_loss(
            -advantages * logprob, action_mask, self.loss_agg_mode, weights=rollout_is_weights
        )
        loss = loss / (1.0 + self.tau)
        value = loss.item()
        return loss, {"opmd_loss": value, "pg_loss": value}

    @classmethod
    def default_args(cls) -> Dict:
        return {"tau": 1.0, "loss_agg_mode": "token-mean"}
