"""The ``EntropyLossFn`` interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch

from trinity.common.registry import Registry

ENTROPY_LOSS_FN: Registry = Registry("entropy_loss_fn", base=lambda: EntropyLossFn)


class EntropyLossFn(ABC):
    """A loss term on the policy's per-token entropy (usually a bonus for exploration)."""

    @abstractmethod
    def __call__(
        self,
        entropy: torch.Tensor,
        action_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """``entropy`` and ``action_mask`` are ``(B, R)``; return the loss term to add to the
        policy loss and its metrics (bare names; the trainer adds ``actor/``)."""

    @classmethod
    def default_args(cls) -> Dict:
        """Default constructor arguments, used where the config leaves them unset."""
        return {}
