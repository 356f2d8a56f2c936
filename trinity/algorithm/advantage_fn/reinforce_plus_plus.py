"""REINFORCE++ advantages: per-token discounted returns, whitened over the batch."""

from __future__ import annotations

from typing import Dict, Tuple

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn, advantage_metrics
from trinity.algorithm.advantage_fn.common import (
    discounted_returns,
    masked_whiten,
    token_rewards,
)
from trinity.common.experience import ExperienceBatch


@ADVANTAGE_FN.register_module("reinforceplusplus")
class REINFORCEPlusPlusAdvantageFn(AdvantageFn):
    """REINFORCE++ (veRL ``adv_estimator: reinforce_plus_plus``).

    Reads ``exps.token_level_rewards`` (``(B, R)``; with an in-reward KL penalty every
    token carries ``-kl_coef * kl``; without them, the scalar ``rewards`` sit on the last
    action token) and ``exps.action_mask``. ``returns`` are the discounted reward-to-go
    ``G_t = r_t + gamma * G_{t+1}`` over action tokens (see ``discounted_returns`` for how
    the environment's tokens are skipped); ``advantages`` are those returns whitened over
    every action token of the batch, which stands in for a critic's baseline.

    Args:
        gamma: discount between consecutive action tokens.
    """

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = gamma

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        mask = exps.action_mask
        returns = discounted_returns(token_rewards(exps), mask, self.gamma)
        exps.returns = returns
        exps.advantages = masked_whiten(returns, mask)
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {"gamma": 1.0}
