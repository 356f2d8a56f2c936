"""Supervised fine-tuning: negative log-likelihood of the response tokens."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import aggregate_loss


@POLICY_LOSS_FN.register_module("sft")
class SFTLossFn(PolicyLossFn):
    """``agg(-logprob)`` over the tokens of ``action_mask``."""

    def __init__(self, loss_agg_mode: str = "token-mean") -> None:
        super().__init__(loss_agg_mode)

    def __call__(  # type: ignore[override]
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs
    ) -> Tuple[torch.Tensor, Dict]:
        """``logprob`` and ``action_mask`` are ``(B, R)``; returns the loss and ``sft_loss``."""
        sft_loss = aggregate_loss(-logprob, action_mask, self.loss_agg_mode)
        return sft_loss, {"sft_loss": sft_loss.item()}

    @classmethod
    def default_args(cls) -> Dict:
        return {"loss_agg_mode": "token-mean"}
