"""The built-in entropy terms: a weighted entropy bonus, or none."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.entropy_loss_fn.base import ENTROPY_LOSS_FN, EntropyLossFn
from trinity.algorithm.utils import aggregate_loss, masked_mean


@ENTROPY_LOSS_FN.register_module("default")
class DefaultEntropyLossFn(EntropyLossFn):
    """``-entropy_coef * agg(entropy)``: minimising it maximises entropy.

    Args:
        entropy_coef: veRL ``entropy_coeff``; 0 (the default) keeps the term at zero while
            still reporting the policy's entropy.
    """

    def __init__(self, entropy_coef: float = 0.0) -> None:
        self.entropy_coef = entropy_coef

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """Metrics: ``entropy`` (mean over valid tokens) and ``entropy_loss`` (the term)."""
        loss = -self.entropy_coef * aggregate_loss(entropy, action_mask, loss_agg_mode)
        metrics = {
            "entropy": masked_mean(entropy, action_mask).item(),
            "entropy_loss": loss.item(),
        }
        return loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"entropy_coef": 0.0}


@ENTROPY_LOSS_FN.register_module("none")
class NoEntropyLossFn(EntropyLossFn):
    """No entropy term; the mean token entropy is still reported as ``entropy``."""

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        return entropy.new_zeros(()), {"entropy": masked_mean(entropy, action_mask).item()}
