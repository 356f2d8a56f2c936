"""Task selectors (the order rows are visited in each epoch) and the resumable batch cursor.

A selector is registered in ``TASK_SELECTORS`` under the name users write in
``task_selector.selector_type``; it only has to return a permutation of row indices for an
epoch, deterministically, so a resumed run can rebuild the order from ``(seed, epoch)``.
"""

from __future__ import annotations

import logging
import math
import random
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional

from trinity.common.registry import Registry

logger = logging.getLogger("trinity.buffer")

TASK_SELECTORS: Registry = Registry("task_selectors", base=lambda: TaskSelector)


class TaskSelector(ABC):
    """Decides the order of row indices within one epoch."""

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed

    @abstractmethod
    def order(self, num_rows: int, epoch: int) -> List[int]:
        """A permutation of ``range(num_rows)``; must depend only on (seed, epoch)."""


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


def build_selector(task_selector: Any) -> TaskSelector:
    """The selector a storage's ``task_selector`` config (or None) asks for."""
    if task_selector is None:
        return SequentialSelector()
    name = task_selector.selector_type
    if name not in TASK_SELECTORS and "." not in name:
        raise ValueError(
            f"task_selector.selector_type = {name!r} is not valid; choose one of "
            f"{', '.join(TASK_SELECTORS.names())}"
        )
    seed = task_selector.seed if task_selector.seed is not None else 42
    return TASK_SELECTORS.get(name)(seed=seed)


class BatchCursor:
    """Hands out row indices batch by batch across epochs, and remembers where it is.

    Batches run on across epoch boundaries, so every batch is full except possibly the last
    one of the last epoch. With ``total_steps`` set, epochs are unlimited and reading stops
    after that many batches; otherwise it stops when ``total_epochs`` passes are done.
    """

    def __init__(
        self,
        num_rows: int,
        selector: TaskSelector,
        total_epochs: int = 1,
        total_steps: Optional[int] = None,
    ) -> None:
        self.num_rows = num_rows
        self.selector = selector
        self.total_epochs = total_epochs
        self.total_steps = total_steps
        self.epoch = 0
        self.index = 0  # position inside this epoch's order
        self.steps = 0  # batches handed out so far
        self._order = selector.order(num_rows, 0)

    def next_batch(self, batch_size: int) -> List[int]:
        """Row indices of the next batch; raises ``StopIteration`` when reading is over."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if self.total_steps is not None and self.steps >= self.total_steps:
            raise StopIteration(f"all {self.total_steps} steps have been read")
        indices = self.take(batch_size)
        if not indices:
            raise StopIteration(f"all {self.total_epochs} epochs have been read")
        self.steps += 1
        return indices

    def take(self, n: int) -> List[int]:
        """Up to ``n`` more row indices without counting a step (fewer only at the very end)."""
        out: List[int] = []
        while len(out) < n and not self._exhausted():
            if self.index >= self.num_rows:
                self._start_epoch(self.epoch + 1)
                continue
            stop = min(self.num_rows, self.index + n - len(out))
            out.extend(self._order[self.index : stop])
            self.index = stop
        return out

    def num_steps(self, batch_size: int) -> int:
        """How many batches of ``batch_size`` this cursor hands out from the start."""
        if self.total_steps is not None:
            return self.total_steps
        return math.ceil(self.num_rows * self.total_epochs / batch_size)

    def _exhausted(self) -> bool:
        if self.total_steps is not None:
            return False
        return self.epoch >= self.total_epochs or (
            self.epoch == self.total_epochs - 1 and self.index >= self.num_rows
        )

    def _start_epoch(self, epoch: int) -> None:
        self.epoch, self.index = epoch, 0
        self._order = self.selector.order(self.num_rows, epoch)

    def state_dict(self) -> Dict[str, int]:
        return {
            "epoch": self.epoch,
            "index": self.index,
            "steps": self.steps,
            "rows": self.num_rows,
        }

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if state.get("rows", self.num_rows) != self.num_rows:
            # the data changed between runs: positions still apply, but say so
            logger.warning(
                "resuming a reader saved with %s rows on data that now has %s rows",
                state["rows"],
                self.num_rows,
            )
        self._start_epoch(int(state["epoch"]))
        self.index = min(int(state["index"]), self.num_rows)
        self.steps = int(state["steps"])
