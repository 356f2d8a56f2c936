"""``importance_sampling``: REINFORCE corrected by the ratio to the sampling policy."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.tinker.losses.base import LossSpec


def importance_sampling(
    logprobs: torch.Tensor, inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> torch.Tensor:
    """``-sum(exp(logprobs - sampling_logprobs) * advantages)``: the ratio carries the
    gradient, ``advantages`` (zero on prompt tokens) say which tokens count."""
    ratio = torch.exp(logprobs - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


IMPORTANCE_SAMPLING = LossSpec(
    "importance_sampling", importance_sampling, required=("logprobs", "advantages")
)
