"""What a Tinker loss declares: its inputs, its config keys, and the function."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch

# (target logprobs, the datum's loss_fn_inputs as float tensors, loss_fn_config) -> loss
LossFn = Callable[[torch.Tensor, Dict[str, torch.Tensor], Dict[str, float]], torch.Tensor]


@dataclass(frozen=True)
class LossSpec:
    """``required``/``optional``: the ``loss_fn_inputs`` keys besides ``target_tokens``;
    ``config``: the ``loss_fn_config`` keys with their defaults (None: the key is required);
    ``candidates``: whether ``target_tokens`` may be ``(N, K)`` (K candidates per position)."""

    name: str
    fn: LossFn
    required: Tuple[str, ...] = ()
    optional: Tuple[str, ...] = ()
    config: Dict[str, Optional[float]] = field(default_factory=dict)
    candidates: bool = False


def clip_bounds(
    inputs: Dict[str, torch.Tensor], config: Dict[str, float]
) -> Tuple[torch.Tensor | float, torch.Tensor | float]:
    """The ratio's clip range: per-token ``clip_low_threshold``/``clip_high_threshold``
    inputs where the datum has them, else the config's values."""
    low = inputs.get("clip_low_threshold", config["clip_low_threshold"])
    high = inputs.get("clip_high_threshold", config["clip_high_threshold"])
    return low, high


# The clip range of ppo and cispo: Tinker's documented epsilon of 0.2 on both sides.
CLIP_CONFIG: Dict[str, Optional[float]] = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
CLIP_INPUTS = ("clip_low_threshold", "clip_high_threshold")
