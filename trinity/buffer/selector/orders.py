"""Selectors that do not learn: ``sequential``, ``shuffle``, ``random``, ``offline_easy2hard``."""

from __future__ import annotations

import random
from typing import Dict, List, Sequence

from trinity.buffer.selector.base import TASK_SELECTORS, BatchSelector, TaskSelector


@TASK_SELECTORS.register_module("sequential")
class SequentialSelector(TaskSelector):
    """File order, every epoch."""

    def order(self, num_rows: int, epoch: int) -> List[int]:
        return list(range(num_rows))


@TASK_SELECTORS.register_module("shuffle")
class ShuffleSelector(TaskSelector):
    """A fresh shuffle each epoch, seeded with ``seed + epoch``."""

    def order(self, num_rows: int, epoch: int) -> List[int]:
        indices = list(range(num_rows))
        random.Random(self.seed + epoch).shuffle(indices)
        return indices


@TASK_SELECTORS.register_module("random")
class RandomSelector(BatchSelector):
    """Each batch a uniform draw without replacement, independent of the batches before
    (so over an epoch some rows come up twice and others not at all), seeded with
    ``seed + drawn``."""

    def pick(self, num_rows: int, n: int, drawn: int) -> List[int]:
        return random.Random(self.seed + drawn).sample(range(num_rows), n)


@TASK_SELECTORS.register_module("offline_easy2hard")
class OfflineEasy2HardSelector(TaskSelector):
    """Rows sorted once by their ``feature_keys`` columns (the first, then the next for
    ties, then file order), the same order every epoch: a curriculum fixed before training.

    ``descending`` (default, as upstream reads features): the highest value first, for a
    column where higher means easier, such as a prior run's accuracy on the task. Set it
    false for a column where higher means harder, such as a difficulty level.
    """

    def __init__(
        self, seed: int = 42, feature_keys: Sequence[str] = (), descending: bool = True
    ) -> None:
        super().__init__(seed, feature_keys)
        if not self.feature_keys:
            raise ValueError(
                "offline_easy2hard orders rows by task_selector.feature_keys, which is empty; "
                "name the column(s) holding each row's difficulty or prior accuracy"
            )
        self.descending = descending
        self._sorted: List[int] = []

    def bind(self, num_rows: int, features: Dict[str, List[float]]) -> None:
        sign = -1.0 if self.descending else 1.0
        columns = [features[key] for key in self.feature_keys]

        def key(index: int) -> tuple:
            return (*(sign * column[index] for column in columns), index)

        self._sorted = sorted(range(num_rows), key=key)

    def order(self, num_rows: int, epoch: int) -> List[int]:
        if len(self._sorted) != num_rows:
            raise RuntimeError("offline_easy2hard: bind() the rows' features before ordering")
        return list(self._sorted)
