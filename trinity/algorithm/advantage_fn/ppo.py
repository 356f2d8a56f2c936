"""PPO's advantages: generalised advantage estimation (GAE) with a critic's values."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn, advantage_metrics
from trinity.algorithm.advantage_fn.common import masked_whiten, token_rewards
from trinity.common.experience import ExperienceBatch


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GAE over the action tokens of each row.

    Args:
        rewards: ``(B, R)`` per-token rewards.
        values: ``(B, R)`` the critic's value of the state before each response token.
        mask: ``(B, R)`` 1 on action tokens.
        gamma: discount; lam: GAE's bias/variance trade-off.

    Returns:
        ``(advantages, returns)``, both ``(B, R)`` and 0 where ``mask`` is 0, with
        ``delta_t = r_t + gamma * V_{t'} - V_t``, ``A_t = delta_t + gamma * lam * A_{t'}`` and
        ``returns = A + V``, where ``t'`` is the next action token (``V = A = 0`` after the
        last one). Masked tokens are not steps: the value and advantage of the next step pass
        over them unchanged, so padding never enters the recursion and the environment's
        tokens between turns neither discount nor contribute a (meaningless) value. Rewards
        on masked tokens are ignored; the KL fns put rewards on action tokens only.
    """
    B, R = rewards.shape
    next_value = torch.zeros(B, device=rewards.device)
    next_adv = torch.zeros(B, device=rewards.device)
    advantages = torch.zeros(B, R, device=rewards.device)
    for t in reversed(range(R)):
        step = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        # torch.where, not a product with the mask, so a NaN value on padding cannot leak.
        next_value = torch.where(step, values[:, t], next_value)
        next_adv = torch.where(step, adv, next_adv)
        advantages[:, t] = torch.where(step, adv, torch.zeros_like(adv))
    returns = torch.where(mask > 0, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


@ADVANTAGE_FN.register_module("ppo")
class PPOAdvantageFn(AdvantageFn):
    """GAE advantages (veRL ``adv_estimator: gae``) for PPO with a critic.

    Reads ``exps.extra["values"]`` (``(B, R)``, set by the critic before this call),
    ``exps.token_level_rewards`` (else the scalar ``exps.rewards`` on the last action token)
    and ``exps.action_mask``. Sets ``exps.advantages`` (whitened over the batch's action
    tokens unless ``whiten_advantages`` is False) and ``exps.returns`` (``A + V`` before
    whitening: the critic's regression target).
    """

    def __init__(
        self, gamma: float = 1.0, lam: float = 1.0, whiten_advantages: bool = True
    ) -> None:
        self.gamma = gamma
        self.lam = lam
        self.whiten_advantages = whiten_advantages

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        values = exps.extra.get("values")
        if values is None:
            raise ValueError(
                "the 'ppo' (GAE) advantage needs the critic's values in "
                "exps.extra['values'] ((B, R) floats); no critic has set them"
            )
        mask = exps.action_mask
        if values.shape != mask.shape:
            raise ValueError(
                f"exps.extra['values'] has shape {tuple(values.shape)}, expected the response "
                f"shape {tuple(mask.shape)}"
            )
        advantages, returns = gae_advantages(
            token_rewards(exps), values.detach().float(), mask, self.gamma, self.lam
        )
        if self.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
        exps.advantages = advantages
        exps.returns = returns
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {"gamma": 1.0, "lam": 1.0, "whiten_advantages": True}
