"""The reward-function interface and registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, Optional

from trinity.common.registry import Registry

REWARD_FUNCTIONS: Registry = Registry("reward_functions", base=lambda: RewardFn)


class RewardFn(ABC):
    """Scores one response. Returns named components; the reward is their sum."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no arguments, got {sorted(kwargs)}")

    @abstractmethod
    def __call__(
        self, response: str, truth: Optional[str] = None, **kwargs: Any
    ) -> Dict[str, float]:
        """Score ``response`` against ``truth``; ``kwargs`` carries the raw task row."""


def total_reward(components: Dict[str, float]) -> float:
    """The scalar reward of a component dict."""
    return float(sum(components.values()))
