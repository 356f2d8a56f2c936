"""``cispo``: REINFORCE weighted by the clipped ratio, which carries no gradient."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.tinker.losses.base import CLIP_CONFIG, CLIP_INPUTS, LossSpec, clip_bounds


def cispo(
    logprobs: torch.Tensor, inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> torch.Tensor:
    """``-sum(sg(clip(r, low, high)) * logprobs * A)``: unlike ppo no token loses its
    gradient, the clip only bounds its weight."""
    ratio = torch.exp(logprobs - inputs["logprobs"])
    low, high = clip_bounds(inputs, config)
    weight = torch.clamp(ratio, low, high).detach()
    return -(weight * logprobs * inputs["advantages"]).sum()


CISPO = LossSpec(
    "cispo", cispo, required=("logprobs", "advantages"), optional=CLIP_INPUTS, config=CLIP_CONFIG
)
