"""``ppo``: the clipped surrogate, token by token."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.tinker.losses.base import CLIP_CONFIG, CLIP_INPUTS, LossSpec, clip_bounds


def ppo(
    logprobs: torch.Tensor, inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> torch.Tensor:
    """``-sum(min(r * A, clip(r, low, high) * A))`` with ``r = exp(logprobs -
    sampling_logprobs)`` and ``low``/``high`` the ratio's bounds (``clip_low_threshold``,
    ``clip_high_threshold``: 0.8 and 1.2 unless the config or the datum says otherwise)."""
    ratio = torch.exp(logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    low, high = clip_bounds(inputs, config)
    clipped = torch.clamp(ratio, low, high)
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


PPO = LossSpec(
    "ppo", ppo, required=("logprobs", "advantages"), optional=CLIP_INPUTS, config=CLIP_CONFIG
)
