"""SAPO: a temperature-controlled soft gate instead of PPO's hard clip (arXiv:2511.20347)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


def soft_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """SAPO's ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, elementwise. Its slope
    ``4 sigmoid (1 - sigmoid)`` is 1 at ``r = 1`` and fades smoothly away from it."""
    return torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau


@POLICY_LOSS_FN.register_module("sapo")
class SAPOPolicyLossFn(PolicyLossFn):
    """``agg(-A * f(r))`` with ``r = exp(logprob - old_logprob)`` and the soft gate ``f``.

    Soft Adaptive Policy Optimization (Qwen team 2025, arXiv:2511.20347): the
    objective ``J = E[1/G sum_i 1/|y_i| sum_t f_it(r_it) A_it]`` with
    ``f_it(x) = sigmoid(tau_it (x - 1)) * 4 / tau_it``. Its gradient weighs each token's
    ``r * A * grad log pi`` by ``w = 4 p (1 - p)``, ``p = sigmoid(tau (r - 1))``: exactly the
    policy gradient on-policy (``w = 1`` at ``r = 1``), decaying smoothly as the ratio leaves
    1 instead of PPO's cut to zero, so off-policy tokens are attenuated, not discarded. The
    temperature is ``tau_pos`` on tokens with a positive advantage and ``tau_neg``
    otherwise; the paper takes ``tau_neg > tau_pos``, damping negative updates faster, as
    they spread probability over many tokens and destabilise more.

    Args:
        tau_pos / tau_neg: the gate's temperatures (> 0); larger is a narrower gate.
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``; the paper's
            ``1/|y_i|`` per sequence is ``seq-mean-token-mean``.
    """

    def __init__(
        self,
        tau_pos: float = 1.0,
        tau_neg: float = 1.05,
        loss_agg_mode: str = "seq-mean-token-mean",
    ) -> None:
        super().__init__(loss_agg_mode)
        if not (tau_pos > 0.0 and tau_neg > 0.0):
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
        self.tau_pos, self.tau_neg = tau_pos, tau_neg

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)``. Metrics: ``pg_loss``, ``soft_gate`` (mean gradient weight
        ``w`` over valid tokens: 1 on-policy) and ``ppo_kl``. ``rollout_is_weights``: as for
        PPO."""
        log_ratio = logprob - old_logprob
        # exp(+-20) stays finite, so a far off-policy token never makes inf * 0 = NaN
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        tau = torch.where(advantages > 0, self.tau_pos, self.tau_neg).to(ratio.dtype)
        pg_loss = aggregate_loss(
            -advantages * soft_gate(ratio, tau),
            action_mask,
            self.loss_agg_mode,
            weights=rollout_is_weights,
        )
        p = torch.sigmoid(tau * (ratio.detach() - 1.0))
        metrics = {
            "pg_loss": pg_loss.item(),
            "soft_gate": masked_mean(4.0 * p * (1.0 - p), action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio.detach(), action_mask).item(),
        }
        return pg_loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"tau_pos": 1.0, "tau_neg": 1.05, "loss_agg_mode": "seq-mean-token-mean"}
