"""Replay priority functions: which consumed experience a train step reuses first.

``replay_buffer.priority_fn`` names one of ``PRIORITY_FN`` and ``priority_fn_args`` are its
arguments. A priority function scores an experience from the weights that produced it
(``model_version``) and how many train steps have used it (``use_count``, the first use
included), and says whether it may be used again at all. Higher scores are reused first.
"""

from __future__ import annotations

import random
from typing import Optional

from trinity.common.registry import Registry


class PriorityFn:
    """``model_version - decay * use_count``, plus Gaussian noise of ``sigma`` when it is
    positive; an experience used ``use_count_limit`` times is retired (0: never retired).

    The registered functions are this one with different arguments: ``linear_decay``
    fixes ``use_count_limit: 0`` and ``sigma: 0``; ``decay_limit_randomization`` is the
    original's later name of ``linear_decay_use_count_control_randomization``.
    """

    def __init__(
        self,
        decay: float = 2.0,
        use_count_limit: int = 3,
        sigma: float = 0.0,
        seed: Optional[int] = None,
    ) -> None:
        if not isinstance(use_count_limit, int) or isinstance(use_count_limit, bool):
            raise ValueError(f"use_count_limit must be an integer, got {use_count_limit!r}")
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.decay = float(decay)
        self.use_count_limit = use_count_limit
        self.sigma = float(sigma)
        self.rng = random.Random(seed)

    def priority(self, model_version: int, use_count: int) -> float:
        """The score of an experience of ``model_version`` used ``use_count`` times."""
        score = model_version - self.decay * use_count
        if self.sigma > 0:
            score += self.rng.gauss(0.0, self.sigma)
        return score

    def reusable(self, use_count: int) -> bool:
        """Whether an experience used ``use_count`` times may be used again."""
        return self.use_count_limit <= 0 or use_count < self.use_count_limit


PRIORITY_FN: Registry = Registry("priority_fn", base=lambda: PriorityFn)


def linear_decay(decay: float = 2.0) -> PriorityFn:
    """``model_version - decay * use_count``; reused without limit."""
    return PriorityFn(decay=decay, use_count_limit=0, sigma=0.0)


PRIORITY_FN.register_module("linear_decay", linear_decay)
PRIORITY_FN.register_module("linear_decay_use_count_control_randomization", PriorityFn)
PRIORITY_FN.register_module("decay_limit_randomization", PriorityFn)


def build_priority_fn(name: str, args: dict) -> PriorityFn:
    """The priority function ``name`` built with ``args`` (KeyError, TypeError, ValueError)."""
    return PRIORITY_FN.get(name)(**args)
