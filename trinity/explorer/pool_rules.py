"""Rules the runner pool applies to a step's tasks, as plain classes (no Ray):

- ``OverRollout`` (``explorer.over_rollout``): a training step goes on once enough of its
  tasks finished and ``wait_after_min`` more seconds passed; the rest are left behind.
- ``DynamicTimeout`` (``explorer.dynamic_timeout``): a task's time limit follows the mean
  time of the tasks that succeeded so far.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Callable, Dict, Iterable, Optional, Tuple


def min_tasks(batch: int, ratio: float) -> int:
    """Tasks a step waits for with ``over_rollout.ratio``: ``ceil((1 - ratio) * batch)``,
    at least one. Rounded first so that e.g. ``(1 - 0.7) * 10`` is 3, not 4."""
    return max(1, math.ceil(round((1.0 - ratio) * batch, 9)))


class OverRollout:
    """Counts a step's finished tasks; says when the step may go on without the others.

    A task split into pieces (``max_repeat_times_per_runner``) is finished when all its
    pieces are; a piece that failed after its retries counts as finished (it will not
    produce anything by waiting longer).
    """

    def __init__(
        self,
        tasks: Iterable[Any],
        enough: int,
        wait_after_min: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pieces = Counter(task.task_id for task in tasks)
        self.enough, self.wait_after_min, self.clock = enough, wait_after_min, clock
        self.finished: Counter = Counter()
        self.reached_at: Optional[float] = None  # when ``enough`` tasks had finished

    def finish(self, task: Any) -> None:
        self.finished[task.task_id] += 1
        if self.reached_at is None and self.complete() >= self.enough:
            self.reached_at = self.clock()

    def complete(self) -> int:
        """Tasks whose every piece finished."""
        return sum(1 for tid, n in self.finished.items() if n >= self.pieces[tid])

    def seconds_left(self) -> Optional[float]:
        """Seconds until the step goes on without its unfinished tasks (None: not yet known)."""
        if self.reached_at is None:
            return None
        return max(0.0, self.reached_at + self.wait_after_min - self.clock())

    def expired(self) -> bool:
        left = self.seconds_left()
        return left is not None and left <= 0


class DynamicTimeout:
    """A task's time limit: ``ratio`` x the mean seconds of the successful tasks of its kind
    so far, never above ``max_timeout`` (the hard limit, and the limit before any success).

    The kind is (eval or not, samples asked for): an eval task asking for one sample and a
    training task asking for eight take very different times.
    """

    def __init__(self, max_timeout: float, ratio: Optional[float] = None) -> None:
        """``ratio`` None: the limit is always ``max_timeout`` (dynamic timeout off)."""
        self.max_timeout, self.ratio = max_timeout, ratio
        self.totals: Dict[Tuple[bool, int], Tuple[float, int]] = {}  # kind -> (seconds, count)

    @staticmethod
    def kind(task: Any) -> Tuple[bool, int]:
        return bool(getattr(task, "is_eval", False)), int(task.rollout_args.n)

    def record(self, task: Any, seconds: float) -> None:
        """A task that succeeded took ``seconds`` (from sending it to its result)."""
        total, count = self.totals.get(self.kind(task), (0.0, 0))
        self.totals[self.kind(task)] = (total + seconds, count + 1)

    def limit(self, task: Any) -> float:
        total, count = self.totals.get(self.kind(task), (0.0, 0))
        if self.ratio is None or count == 0:
            return self.max_timeout
        return min(self.max_timeout, total / count * self.ratio)

    def describe(self, task: Any) -> str:
        """``task``'s limit and the setting it comes from, for messages."""
        limit = self.limit(task)
        if limit >= self.max_timeout:
            return f"explorer.max_timeout={self.max_timeout:g}s"
        total, count = self.totals[self.kind(task)]
        return (
            f"{limit:.3g}s (explorer.dynamic_timeout: {self.ratio:g} x {total / count:.3g}s, "
            f"the mean time of {count} successful task(s) like it)"
        )
