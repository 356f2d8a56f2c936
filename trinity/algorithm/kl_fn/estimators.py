"""The built-in KL estimators. With ``kl = logprob - ref_logprob``:

| name | formula | veRL ``kl_penalty`` / ``kl_loss_type`` |
| --- | --- | --- |
| ``k1`` | ``kl`` | ``kl`` |
| ``k2`` | ``0.5 * kl**2`` | ``mse`` |
| ``k3`` (alias ``low_var_kl``) | ``exp(-kl) + kl - 1``, clamped to [-10, 10] | ``low_var_kl`` |
| ``abs`` | ``abs(kl)`` | ``abs`` |
| ``none`` | 0: no KL term, no reference model needed | ``use_kl_loss=False`` |
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.kl_fn.base import KL_FN, KLFn, last_token_rewards
from trinity.common.experience import ExperienceBatch


@KL_FN.register_module("k1")
class K1Fn(KLFn):
    """Unbiased, high-variance, can be negative per token (veRL ``kl``)."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        return logprob - ref_logprob


@KL_FN.register_module("k2")
class K2Fn(KLFn):
    """Half the squared log-ratio: biased, low variance, its gradient is the KL's (veRL ``mse``)."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logprob - ref_logprob).square()


@KL_FN.register_module("low_var_kl")
@KL_FN.register_module("k3")
class K3Fn(KLFn):
    """``ratio - log(ratio) - 1`` with ``ratio = pi_ref / pi``: unbiased, non-negative."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        # Clamping the exponent keeps exp() finite, so the clamped tokens get a zero gradient
        # instead of 0 * inf = NaN; the output clamp matches veRL's low_var_kl.
        log_ratio = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


@KL_FN.register_module("abs")
class AbsFn(KLFn):
    """Absolute log-ratio (veRL ``abs``)."""

    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        return (logprob - ref_logprob).abs()


@KL_FN.register_module("none")
class NoKLFn(KLFn):
    """No KL: zero loss, and the reward penalty only places the reward on the last token.

    ``kl_coef`` is accepted (and unused) so veRL-mapped configs that set it still load.
    """

    def calculate_kl(
        self, logprob: torch.Tensor, ref_logprob: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return torch.zeros_like(logprob)

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: Optional[torch.Tensor],
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
    ) -> Tuple[torch.Tensor, Dict]:
        return logprob.new_zeros(()), {}

    def apply_kl_penalty_to_reward(self, exps: ExperienceBatch) -> Tuple[ExperienceBatch, Dict]:
        exps.token_level_rewards = last_token_rewards(exps)
        return exps, {}

    @classmethod
    def default_args(cls) -> Dict:
        return {}
