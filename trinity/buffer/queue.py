"""ExperienceQueue: the thread-safe FIFO between explorer (writer) and trainer (reader).

With a store, every put is written durably before readers can see it, and every get marks
its rows consumed, so a queue rebuilt on the same store after a crash resumes with exactly
the experiences that were written but not yet read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

from trinity.buffer.store import ExperienceStore
from trinity.common.experience import Experience


class ExperienceQueue:
    """FIFO of experiences with blocking, time-limited reads and an explicit end of input."""

    def __init__(self, capacity: Optional[int] = None, store: Optional[ExperienceStore] = None):
        if capacity is not None and capacity <= 0:
            raise ValueError(f"queue capacity must be positive or None, got {capacity}")
        self.capacity = capacity
        self.store = store
        self._items: Deque[Tuple[Optional[int], Experience]] = deque()  # (store id, exp)
        self._cond = threading.Condition()
        self._closed = False
        if store is not None:
            self._items.extend(store.unconsumed())

    def put(self, exps: Sequence[Experience], timeout: Optional[float] = None) -> None:
        """Append ``exps`` (durably first, when there is a store).

        With a ``capacity``, waits until the batch fits (a batch larger than the whole
        capacity goes in once the queue is empty); raises ``TimeoutError`` after ``timeout``.
        """
        exps = list(exps)
        with self._cond:
            ready = self._cond.wait_for(lambda: self._closed or self._fits(len(exps)), timeout)
            if self._closed:
                raise RuntimeError("cannot put into a closed ExperienceQueue")
            if not ready:
                raise TimeoutError(f"queue stayed full ({len(self._items)} items) for {timeout}s")
            # the write happens under the lock so store order equals queue order
            ids = self.store.add(exps) if self.store is not None else [None] * len(exps)
            self._items.extend(zip(ids, exps, strict=True))
            self._cond.notify_all()

    def get(self, n: int, timeout: Optional[float] = None) -> List[Experience]:
        """The next ``n`` experiences, oldest first.

        Blocks until ``n`` are available. When ``timeout`` seconds pass first, or the queue
        is closed, returns what is there (possibly fewer than ``n``, possibly none after a
        timeout). Raises ``StopIteration`` once the queue is closed and empty. An ``n``
        above ``capacity`` can only be served by the timeout or ``close``.
        """
        if n <= 0:
            raise ValueError(f"get needs a positive n, got {n}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._items) < n and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if self._closed and not self._items:
                raise StopIteration("the experience queue is closed and empty")
            taken = [self._items.popleft() for _ in range(min(n, len(self._items)))]
            if self.store is not None:
                self.store.mark_consumed([i for i, _ in taken])
            self._cond.notify_all()  # room for writers waiting on capacity
        return [exp for _, exp in taken]

    def drop_all(self) -> int:
        """Mark every waiting experience consumed without reading it; returns how many.

        Used when a resumed run re-explores from the trainer's checkpoint, so experiences
        explored past it would otherwise be trained on twice.
        """
        with self._cond:
            taken = list(self._items)
            self._items.clear()
            if self.store is not None:
                self.store.mark_consumed([i for i, _ in taken])
        return len(taken)

    def close(self) -> None:
        """The writer is done: pending and later gets return what is left, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def size(self) -> int:
        """Number of experiences waiting to be read."""
        with self._cond:
            return len(self._items)

    def _fits(self, n: int) -> bool:
        return self.capacity is None or not self._items or len(self._items) + n <= self.capacity
