"""CHORD-phi: the SFT loss with each token weighted by ``p (1 - p)`` (arXiv:2508.11408)."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss


def phi(logprob: torch.Tensor) -> torch.Tensor:
    """``p (1 - p)`` with ``p = exp(logprob)``, detached: CHORD's token weight (its Eq. 5), a
    coefficient of the token's log-likelihood gradient. Eq. 6 writes it without a stop-gradient;
    we detach it, so each token's gradient is ``phi * grad log p``, the weighting the paper
    argues for. Shape as given."""
    p = logprob.detach().exp()
    return p * (1.0 - p)


@POLICY_LOSS_FN.register_module("sft_phi")
class SFTPhiLossFn(PolicyLossFn):
    """``agg(-phi(p_t) * logprob_t)`` over the expert tokens, ``phi(p) = p (1 - p)``.

    This is the token-wise weighting of Zhang et al. 2025, "On-Policy RL Meets Off-Policy
    Experts: Harmonizing Supervised Fine-Tuning and Reinforcement Learning via Dynamic
    Weighting" (CHORD, arXiv:2508.11408), its CHORD-phi SFT term ``L_SFT-phi`` (Eq. 6 of the
    ICLR 2026 version, section 3.3): ``p_t`` is the policy's probability of the expert's token.
    The weight peaks at ``p = 0.5`` and vanishes at both ends, so tokens the policy already
    predicts (``p -> 1``) and tokens far from its own distribution (``p -> 0``, the ones that
    disrupt it most) barely move it, while the uncertain middle is learnt.

    Args:
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.
    """

    def __init__(self, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)

    def __call__(  # type: ignore[override]
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs
    ) -> Tuple[torch.Tensor, Dict]:
        """``logprob`` and ``action_mask`` ``(B, R)``; returns the loss and ``sft_phi_loss``."""
        loss = aggregate_loss(-phi(logprob) * logprob, action_mask, self.loss_agg_mode)
        return loss, {"sft_phi_loss": loss.item()}

    @classmethod
    def default_args(cls) -> Dict:
        return {"loss_agg_mode": "token-mean"}
