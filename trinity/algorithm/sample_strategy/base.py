"""The ``SampleStrategy`` interface: what the trainer trains on at each step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Protocol, Tuple

from trinity.common.experience import Experience
from trinity.common.registry import Registry

SAMPLE_STRATEGY: Registry = Registry("sample_strategy", base=lambda: SampleStrategy)


class ExperienceReader(Protocol):
    """What a strategy reads from (the trainer's experience buffer)."""

    def read(self, batch_size: int, timeout: Optional[float] = None) -> List[Experience]:
        """Up to ``batch_size`` experiences; fewer when ``timeout`` passes or the buffer
        closes; ``StopIteration`` when it is closed and empty."""
        ...


class SampleStrategy(ABC):
    """Draws the experiences of one train step from ``reader`` (and any other source).

    Args:
        reader: the experience buffer reader.
        **kwargs: ``algorithm.sample_strategy_args``, plus what the trainer shares with every
            strategy; each strategy takes the names it uses.
    """

    def __init__(self, reader: ExperienceReader, **kwargs: Any) -> None:
        self.reader = reader

    @abstractmethod
    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        """The experiences for train step ``step`` and metrics about them.

        May return fewer than ``batch_size`` when the buffer closes or times out, never
        drops experiences silently, and lets the reader's ``StopIteration`` through when
        nothing is left.
        """

    def state_dict(self) -> Dict:
        """What a checkpoint must keep to resume sampling where it stopped."""
        return {}

    def load_state_dict(self, state: Dict) -> None:
        """Restore what ``state_dict`` returned (nothing, for a stateless strategy)."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state, but the checkpoint holds "
                f"{sorted(state)}: was it saved with another sample_strategy?"
            )

    @classmethod
    def default_args(cls) -> Dict:
        """Default constructor arguments, used where the config leaves them unset."""
        return {}

    @classmethod
    def buffer_rows(cls, batch_size: int, args: Dict) -> int:
        """Experiences a step of ``batch_size`` takes from the experience buffer, given the
        strategy's arguments (the rest come from auxiliary buffers); the config checks use
        it to compare a train step with what one explore step produces."""
        return batch_size
