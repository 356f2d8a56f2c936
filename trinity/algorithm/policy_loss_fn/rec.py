"""REC: group-relative REINFORCE with clipping as a token mask (arXiv:2509.24203)."""

from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean

CLIP_MODES = ("none", "one-side", "two-side", "ring")
WEIGHTS = ("none", "importance_sampling", "advantage")
REGULARIZERS = ("none", "k2", "forward-kl")


def rec_token_mask(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mode: str,
    low: float,
    high: float,
    ring: Tuple[float, float],
) -> torch.Tensor:
    """``(B, R)`` bool: the tokens REC keeps for ratios ``r`` and advantages ``A``.

    ``none``: all. ``two-side``: ``1 - low <= r <= 1 + high``. ``one-side``: PPO's
    clipping read as a mask, only the side the update pushes away from 1 is cut
    (``r <= 1 + high`` where ``A > 0``, ``r >= 1 - low`` where ``A < 0``). ``ring``:
    ``two-side`` plus the far tokens the update brings back towards 1 (``r <= 1 - low'``
    where ``A > 0``, ``r >= 1 + high'`` where ``A < 0``), ``ring = (low', high')``.
    """
    inside = (ratio >= 1.0 - low) & (ratio <= 1.0 + high)
    if mode == "none":
        return torch.ones_like(inside)
    if mode == "two-side":
        return inside
    positive, negative = advantages > 0, advantages < 0
    if mode == "one-side":
        return ~((positive & (ratio > 1.0 + high)) | (negative & (ratio < 1.0 - low)))
    low_prime, high_prime = ring
    return (
        inside | (positive & (ratio <= 1.0 - low_prime)) | (negative & (ratio >= 1.0 + high_prime))
    )


@POLICY_LOSS_FN.register_module("rec")
class RECPolicyLossFn(PolicyLossFn):
    """``agg(-K * sg(w) * A * logprob)``: REINFORCE on group-relative advantages, with the
    kept tokens ``K`` from the ratio ``r = exp(logprob - old_logprob)``.

    The REC family of Yao et al. 2025, "Group-relative REINFORCE is secretly an off-policy
    algorithm: Demystifying some myths about GRPO and its friends" (arXiv:2509.24203): seen
    off-policy, group-relative REINFORCE stays stable when the policy update is regularised,
    and clipping does that job (by dropping tokens) while importance sampling is optional.
    The variants are named REC-<clip_mode>-<IS or NoIS>; the defaults are REC-OneSide-NoIS
    (``clip_mode: one-side``, ``weight: none``). ``weight: importance_sampling`` (IS)
    multiplies each token by ``sg(r)``, so a kept token's gradient is PPO's unclipped one;
    ``weight: advantage`` by ``exp(A / temp)``, so larger advantages count more.
    A regulariser adds, per token, ``coef * (logprob - old_logprob)^2`` (``k2``, Kimi's
    squared log-ratio with its 1/2 absorbed in ``coef``) or ``-coef * logprob``
    (``forward-kl``: the likelihood of the sampled tokens, i.e. KL(behaviour || policy)
    up to a constant), before aggregation.

    Args:
        epsilon_low / epsilon_high: the clipping range ``[1 - low, 1 + high]`` of ``r``.
        epsilon_low_prime / epsilon_high_prime: ``ring``'s outer bounds (``1 - low'`` and
            ``1 + high'``, beyond ``[1 - low, 1 + high]``).
        clip_mode: ``none`` | ``one-side`` | ``two-side`` | ``ring`` (``rec_token_mask``).
        weight: ``none`` (NoIS) | ``importance_sampling`` (IS) | ``advantage``.
        temp: the temperature of ``weight: advantage`` (> 0).
        regularizer: ``none`` | ``k2`` | ``forward-kl``; regularizer_coef: its weight (>= 0).
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.
    """

    def __init__(
        self,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        epsilon_low_prime: float = 0.6,
        epsilon_high_prime: float = 2.0,
        clip_mode: Literal["none", "one-side", "two-side", "ring"] = "one-side",
        weight: Literal["none", "importance_sampling", "advantage"] = "none",
        loss_agg_mode: str = "token-mean",
        temp: float = 1.0,
        regularizer: Literal["none", "k2", "forward-kl"] = "none",
        regularizer_coef: float = 0.0,
    ) -> None:
        super().__init__(loss_agg_mode)
        if clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode must be one of {', '.join(CLIP_MODES)}, got {clip_mode}")
        if weight not in WEIGHTS:
            raise ValueError(f"weight must be one of {', '.join(WEIGHTS)}, got {weight}")
        if regularizer not in REGULARIZERS:
            raise ValueError(
                f"regularizer must be one of {', '.join(REGULARIZERS)}, got {regularizer}"
            )
        if not (temp > 0.0 and regularizer_coef >= 0.0):
            raise ValueError(
                f"need temp > 0 and regularizer_coef >= 0, got {temp}, {regularizer_coef}"
            )
        if not (0.0 < epsilon_low <= 1.0 and epsilon_high > 0.0):
            raise ValueError(
                f"need 0 < epsilon_low <= 1 and epsilon_high > 0, got {epsilon_low}, {epsilon_high}"
            )
        if not (epsilon_low <= epsilon_low_prime <= 1.0 and epsilon_high_prime >= epsilon_high):
            raise ValueError(
                "ring's bounds lie outside the clipping range: need epsilon_low <= "
                "epsilon_low_prime <= 1 and epsilon_high_prime >= epsilon_high, got "
                f"{epsilon_low_prime}, {epsilon_high_prime}"
            )
        self.clip_mode, self.weight, self.temp = clip_mode, weight, temp
        self.regularizer, self.regularizer_coef = regularizer, regularizer_coef
        self.bounds = (epsilon_low, epsilon_high, (epsilon_low_prime, epsilon_high_prime))

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
        dropped) and ``ppo_kl``. ``rollout_is_weights``: as for PPO."""
        log_ratio = (logprob - old_logprob).detach()
        # exp(+-20) stays finite, so a far off-policy token never makes inf * 0 = NaN
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        keep = rec_token_mask(ratio, advantages, self.clip_mode, *self.bounds)
        per_token = -keep.to(logprob.dtype) * self._weight(ratio, advantages) * advantages * logprob
        pg_loss = aggregate_loss(
            per_token + self._regularizer(logprob, old_logprob),
            action_mask,
            self.loss_agg_mode,
            weights=rollout_is_weights,
        )
        metrics = {
            "pg_loss": pg_loss.item(),
            "pg_clipfrac": masked_mean((~keep).float(), action_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        }
        return pg_loss, metrics

    def _weight(self, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        if self.weight == "importance_sampling":
            return ratio
        if self.weight == "advantage":
            return torch.exp(advantages / self.temp)
        return torch.ones_like(ratio)

    def _regularizer(self, logprob: torch.Tensor, old_logprob: torch.Tensor) -> torch.Tensor:
        if self.regularizer == "k2":
            return self.regularizer_coef * (logprob - old_logprob).square()
        if self.regularizer == "forward-kl":
            return -self.regularizer_coef * logprob
        return torch.zeros_like(logprob)

    @classmethod
    def default_args(cls) -> Dict:
        return {
            "epsilon_low": 0.2,
            "epsilon_high": 0.2,
            "epsilon_low_prime": 0.6,
            "epsilon_high_prime": 2.0,
            "clip_mode": "one-side",
            "weight": "none",
            "loss_agg_mode": "token-mean",
            "temp": 1.0,
            "regularizer": "none",
            "regularizer_coef": 0.0,
        }
