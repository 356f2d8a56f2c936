"""``cross_entropy``: the weighted negative log-likelihood of the target tokens."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.tinker.losses.base import LossSpec


def cross_entropy(
    logprobs: torch.Tensor, inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> torch.Tensor:
    """``sum(-logprobs * weights)``; without ``weights`` every token weighs 1. With ``(N, K)``
    targets (distillation over K candidates) the weights are per candidate."""
    weights = inputs.get("weights")
    if weights is None:
        return -logprobs.sum()
    return -(logprobs * weights).sum()


CROSS_ENTROPY = LossSpec("cross_entropy", cross_entropy, optional=("weights",), candidates=True)
