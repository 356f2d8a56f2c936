"""The resumable batch cursor: hands out row indices batch by batch across epochs."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional

from trinity.buffer.selector.base import BatchSelector, Selector, TaskSelector, build_selector

logger = logging.getLogger("trinity.buffer")


class BatchCursor:
    """Hands out row indices batch by batch across epochs, and remembers where it is.

    Batches run on across epoch boundaries, so every batch is full except possibly the last
    one of the last epoch. With ``total_steps`` set, epochs are unlimited and reading stops
    after that many batches; otherwise it stops when ``total_epochs`` passes are done. A
    ``BatchSelector``'s epoch is ``num_rows`` rows handed out, whichever rows they were.
    """

    def __init__(
        self,
        num_rows: int,
        selector: Selector,
        total_epochs: int = 1,
        total_steps: Optional[int] = None,
    ) -> None:
        self.num_rows = num_rows
        self.selector = selector
        self.total_epochs = total_epochs
        self.total_steps = total_steps
        self.epoch = 0
        self.index = 0  # position inside this epoch
        self.steps = 0  # batches handed out so far
        self._order: List[int] = []
        self._start_epoch(0)

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
            if isinstance(self.selector, BatchSelector):
                # one draw for the whole request, so its rows are distinct
                left = self.remaining()
                k = min(n - len(out), self.num_rows, self.num_rows if left is None else left)
                out.extend(self.selector.pick(self.num_rows, k, self._drawn()))
                self.epoch, self.index = divmod(self._drawn() + k, self.num_rows)
                continue
            stop = min(self.num_rows, self.index + n - len(out))
            out.extend(self._order[self.index : stop])
            self.index = stop
        return out

    def remaining(self) -> Optional[int]:
        """Rows left to hand out; None when only ``total_steps`` ends the reading."""
        if self.total_steps is not None:
            return None
        return max(0, self.total_epochs * self.num_rows - self._drawn())

    def num_steps(self, batch_size: int) -> int:
        """How many batches of ``batch_size`` this cursor hands out from the start."""
        if self.total_steps is not None:
            return self.total_steps
        return math.ceil(self.num_rows * self.total_epochs / batch_size)

    def feedback(
        self, indices: List[int], values: List[float], counts: Optional[List[int]] = None
    ) -> None:
        """Per-row mean rewards for the selector (``Selector.feedback``)."""
        self.selector.feedback(indices, values, counts)

    def _drawn(self) -> int:
        return self.epoch * self.num_rows + self.index

    def _exhausted(self) -> bool:
        if self.total_steps is not None:
            return False
        return self.epoch >= self.total_epochs or (
            self.epoch == self.total_epochs - 1 and self.index >= self.num_rows
        )

    def _start_epoch(self, epoch: int) -> None:
        self.epoch, self.index = epoch, 0
        if isinstance(self.selector, TaskSelector):
            self._order = self.selector.order(self.num_rows, epoch)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {
            "epoch": self.epoch,
            "index": self.index,
            "steps": self.steps,
            "rows": self.num_rows,
        }
        learned = self.selector.state_dict()
        if learned:
            state["selector"] = learned
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("rows", self.num_rows) != self.num_rows:
            # the data changed between runs: positions still apply, but say so
            logger.warning(
                "resuming a reader saved with %s rows on data that now has %s rows",
                state["rows"],
                self.num_rows,
            )
        # what the selector learned first: a learning TaskSelector's order may depend on it
        self.selector.load_state_dict(state.get("selector", {}))
        self._start_epoch(int(state["epoch"]))
        self.index = min(int(state["index"]), self.num_rows)
        self.steps = int(state["steps"])


def build_cursor(
    task_selector: Any, rows: Any, total_epochs: int = 1, total_steps: Optional[int] = None
) -> BatchCursor:
    """A cursor over ``rows`` (``buffer.rows.Rows``) ordered by the ``task_selector``
    config, its selector bound to the rows' feature columns (checked numbers at load)."""
    selector = build_selector(task_selector)
    features = {key: [float(v) for v in rows[key]] for key in selector.feature_keys}
    selector.bind(len(rows), features)
    return BatchCursor(len(rows), selector, total_epochs, total_steps)
