"""Entropy bonus for the mixed RL + SFT loss: only the policy's own rows count."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.entropy_loss_fn.base import ENTROPY_LOSS_FN
from trinity.algorithm.entropy_loss_fn.default import DefaultEntropyLossFn


@ENTROPY_LOSS_FN.register_module("mix")
class MixEntropyLossFn(DefaultEntropyLossFn):
    """``default`` (``-entropy_coef * agg(entropy)``) over the non-expert rows only.

    Expert demonstrations are not sampled from the policy, so their entropy says nothing
    about its exploration and is neither rewarded nor reported. A (micro-)batch without
    RL rows gives a zero term and no metrics.

    Args:
        entropy_coef: as for ``default``.
    """

    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        expert_mask: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """``entropy``, ``action_mask`` ``(B, R)``; ``expert_mask`` ``(B,)``, 1.0 on expert
        rows. Metrics: ``entropy`` (mean over RL tokens) and ``entropy_loss``."""
        if expert_mask is None:
            raise ValueError(
                "entropy_loss_fn 'mix' needs expert_mask ((B,) 1.0 on expert rows); "
                "use it with the mix algorithm, or choose entropy_loss_fn 'default'"
            )
        if expert_mask.dim() != 1 or expert_mask.shape[0] != entropy.shape[0]:
            raise ValueError(
                f"expert_mask must have shape ({entropy.shape[0]},), got {tuple(expert_mask.shape)}"
            )
        usual = expert_mask <= 0
        if not usual.any():
            return entropy.new_zeros(()), {}
        return super().__call__(entropy[usual], action_mask[usual], loss_agg_mode)
