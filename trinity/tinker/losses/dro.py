"""``dro``: the policy-gradient term minus a quadratic penalty on the log-ratio."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.tinker.losses.base import LossSpec


def dro(
    logprobs: torch.Tensor, inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> torch.Tensor:
    """``-sum(logprobs * A - beta / 2 * (logprobs - sampling_logprobs) ** 2)``."""
    penalty = (logprobs - inputs["logprobs"]) ** 2
    return -(logprobs * inputs["advantages"] - 0.5 * config["beta"] * penalty).sum()


# beta has no default: Tinker's documentation shows one being set but does not say what an
# unset beta means, and a guess would train something else than the caller expects.
DRO = LossSpec("dro", dro, required=("logprobs", "advantages"), config={"beta": None})
