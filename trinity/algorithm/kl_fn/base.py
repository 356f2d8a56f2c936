"""The ``KLFn`` interface: a per-token KL estimator used as a loss term or a reward penalty."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch

from trinity.algorithm.utils import aggregate_loss, masked_mean
from trinity.common.experience import ExperienceBatch
from trinity.common.registry import Registry

KL_FN: Registry = Registry("kl_fn", base=lambda: KLFn)


def last_token_rewards(exps: ExperienceBatch) -> torch.Tensor:
    """``(B, R)`` zeros with each row's scalar reward on its last valid response token
    (see ``ExperienceBatch.last_token_rewards``)."""
    return exps.last_token_rewards()


class KLFn(ABC):
    """KL divergence between the policy and the reference model, per token.

    With ``kl = logprob - ref_logprob`` (log pi - log pi_ref), the estimators are Schulman's
    ``k1``, ``k2`` and ``k3`` (http://joschu.net/blog/kl-approx.html).

    Args:
        kl_coef: weight of the KL term (veRL ``kl_loss_coef`` / ``kl_ctrl.kl_coef``); fixed
            for the whole run.
    """

    # Class-level fallback, so a subclass whose ``__init__`` skips ``super().__init__`` still
    # has a coefficient for ``calculate_kl_loss`` and the in-reward penalty.
    kl_coef: float = 0.001

    def __init__(self, kl_coef: float = 0.001) -> None:
        self.kl_coef = kl_coef

    @abstractmethod
    def calculate_kl(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """Per-token KL estimate, ``(B, R)`` from two ``(B, R)`` logprob tensors."""

    def calculate_kl_loss(
        self,
        logprob: torch.Tensor,
        ref_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
    ) -> Tuple[torch.Tensor, Dict]:
        """The loss term ``kl_coef * agg(kl)`` (add it to the policy loss) and the metrics
        ``kl_loss`` (``agg(kl)`` before the coefficient, as veRL logs it) and ``kl_coef``."""
        if ref_logprob is None:
            raise ValueError(
                f"{type(self).__name__} needs reference logprobs for the KL loss; "
                "set kl_loss_fn: none to train without a reference model"
            )
        kl = aggregate_loss(self.calculate_kl(logprob, ref_logprob), action_mask, loss_agg_mode)
        return self.kl_coef * kl, {"kl_loss": kl.item(), "kl_coef": self.kl_coef}

    def apply_kl_penalty_to_reward(self, exps: ExperienceBatch) -> Tuple[ExperienceBatch, Dict]:
        """Set ``exps.token_level_rewards`` (``(B, R)``) to the reward on the last valid
        token minus ``kl_coef * kl`` on every action token, with ``kl`` between the rollout
        logprobs (``old_logprob``) and ``ref_logprob``.

        Metrics (full names, as veRL): ``actor/reward_kl_penalty`` (mean token KL) and
        ``actor/reward_kl_penalty_coeff``.
        """
        if exps.ref_logprob is None:
            raise ValueError(
                "the in-reward KL penalty needs reference logprobs (exps.ref_logprob); "
                "set kl_penalty_fn: none to train without a reference model"
            )
        kl = self.calculate_kl(exps.old_logprob, exps.ref_logprob) * exps.action_mask
        exps.token_level_rewards = last_token_rewards(exps) - self.kl_coef * kl
        metrics = {
            "actor/reward_kl_penalty": masked_mean(kl, exps.action_mask).item(),
            "actor/reward_kl_penalty_coeff": self.kl_coef,
        }
        return exps, metrics

    @classmethod
    def default_args(cls) -> Dict:
        """Default constructor arguments, used where the config leaves them unset."""
        return {"kl_coef": 0.001}
