"""ExperienceQueue: the accounted FIFO between explorer (writer) and trainer (reader).

The explorer writes each explore step once, whole (``put(exps, step)``), even when the step
produced nothing: that closes the step. A reader asks for up to ``n`` experiences of the steps
it may read (``max_step``) and waits only while one of those steps is still being explored, so
it never waits for experiences that will not come (docs/design-notes.md, "Step accounting and
failures"). Group algorithms read whole groups only.

With a store, every put is written durably before readers can see it, and every get records
which train step consumed the rows; ``rewind_to`` puts back what train steps after a
checkpoint consumed, so a resumed run trains on each experience exactly once.

With ``replay`` (``replay_buffer.enable``), a read's batch is filled up with experiences
earlier train steps consumed (``replay.py``); fresh rows are read and accounted as above.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from trinity.buffer.replay import ReplayPool
from trinity.buffer.store import ExperienceStore
from trinity.common.experience import Experience

# Why a read returned: enough experiences ("full"), every readable step finished ("steps_done"),
# the writer closed the queue ("ended"), or the wait ran out ("timeout": see ``take_partial``).
READ_STATES = ("full", "steps_done", "ended", "timeout")


@dataclass
class Entry:
    id: Optional[int]  # store row id (None without a store)
    step: int  # the explore step that produced it
    exp: Experience


@dataclass
class ReadResult:
    experiences: List[Experience]
    state: str  # one of READ_STATES
    waiting_for: Optional[int] = None  # first readable step not finished yet, if any


class ExperienceQueue:
    """FIFO of experiences tagged with their explore step; reads wait only for what will come."""

    def __init__(
        self,
        store: Optional[ExperienceStore] = None,
        rewind_to: Optional[int] = None,
        replay: Optional[Any] = None,
    ):
        """``rewind_to``: un-consume what train steps after it consumed (resume from there).
        ``replay``: a ``ReplayBufferConfig`` to reuse consumed experiences (``replay.py``)."""
        self.store = store
        self._items: List[Entry] = []
        self._finished: set = set()  # explore steps written
        self._cond = threading.Condition()
        self._ended = False
        if store is not None:
            if rewind_to is not None:
                store.unconsume_after(rewind_to)
            self._items = [Entry(i, s, e) for i, s, e in store.unconsumed()]
            self._finished = set(store.finished_steps())
        # ---- replay (replay.py): after the rewind, so undone steps' uses are forgotten too
        self.replay = None if replay is None else ReplayPool.from_config(replay, store, rewind_to)

    # ---- writer --------------------------------------------------------------------------
    def put(self, exps: Sequence[Experience], step: int) -> None:
        """Append explore step ``step``'s experiences (durably first) and mark it finished."""
        exps = list(exps)
        with self._cond:
            if self._ended:
                raise RuntimeError("cannot put into a closed ExperienceQueue")
            if step in self._finished:
                raise ValueError(f"explore step {step} was already written to the queue")
            # the write happens under the lock so store order equals queue order
            ids = self.store.add(exps, step) if self.store is not None else [None] * len(exps)
            self._items.extend(Entry(i, step, e) for i, e in zip(ids, exps, strict=True))
            self._finished.add(step)
            self._cond.notify_all()

    def close(self) -> None:
        """The writer is done: readers get what is left, then ``ended`` with nothing."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    # ---- reader --------------------------------------------------------------------------
    def get(
        self,
        n: int,
        max_step: Optional[int] = None,
        timeout: Optional[float] = None,
        whole_groups: bool = False,
        consumer: int = 0,
        take_partial: bool = True,
    ) -> ReadResult:
        """Up to ``n`` experiences of explore steps ``<= max_step`` (None: any), oldest first.

        Waits while fewer than ``n`` are there and some step ``<= max_step`` is unfinished.
        With ``whole_groups`` a group (experiences sharing ``group_id`` within a step) is
        taken whole or not at all; a single group larger than ``n`` is taken alone rather
        than split. When ``timeout`` passes first, what is there is taken if
        ``take_partial``, else nothing is (state ``timeout`` either way). ``consumer`` (the
        train step) is recorded in the store for ``rewind_to``.
        """
        if n <= 0:
            raise ValueError(f"get needs a positive n, got {n}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                ready = self._readable(max_step)
                waiting = self._unfinished(max_step)
                if len(ready) >= n or waiting is None or self._ended:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if not take_partial:
                        return ReadResult([], "timeout", waiting)
                    break
                self._cond.wait(left)
            taken = _take(ready, n, whole_groups)
            # Every step up to max_step written is "steps_done" even once the writer closed:
            # a last step that came out empty (all filtered) is still a step, not the end,
            # whether or not the close came before this read. (Unbounded, waiting is None
            # only once closed.)
            if len(ready) >= n:
                state = "full"
            elif max_step is not None and waiting is None:
                state = "steps_done"
            else:
                state = "ended" if self._ended else "timeout"
            chosen = {id(e) for e in taken}
            self._items = [e for e in self._items if id(e) not in chosen]
            if self.store is not None:
                self.store.mark_consumed([e.id for e in taken], consumer)
            if self.replay is not None:  # ---- replay (replay.py): fills, never waits
                exps = self.replay.serve(taken, n, state, whole_groups, consumer)
                return ReadResult(exps, state, waiting)
            return ReadResult([e.exp for e in taken], state, waiting)

    def _readable(self, max_step: Optional[int]) -> List[Entry]:
        return [e for e in self._items if max_step is None or e.step <= max_step]

    def _unfinished(self, max_step: Optional[int]) -> Optional[int]:
        """The first step ``<= max_step`` not written yet (None: all written, or no bound)."""
        if max_step is None:
            return None if self._ended else self.last_step() + 1
        missing = [s for s in range(1, max_step + 1) if s not in self._finished]
        return missing[0] if missing else None

    # ---- state ---------------------------------------------------------------------------
    def last_step(self) -> int:
        """The highest explore step written so far (0 if none)."""
        return max(self._finished, default=0)

    @property
    def closed(self) -> bool:
        return self._ended

    def size(self) -> int:
        """Number of experiences waiting to be read."""
        with self._cond:
            return len(self._items)

    # ---- rows another process wrote (a decoupled `train` run: store_follower.py) ----------
    def held_ids(self) -> List[int]:
        """Store ids of the experiences waiting to be read."""
        with self._cond:
            return [e.id for e in self._items if e.id is not None]

    def add_written(
        self, rows: Sequence[Tuple[int, int, Experience]], steps: Iterable[int]
    ) -> None:
        """Make readable (id, explore step, experience) rows and finished steps that are in
        the store already (another process wrote them): nothing is written."""
        with self._cond:
            self._items.extend(Entry(i, s, e) for i, s, e in rows)
            self._finished.update(steps)
            self._cond.notify_all()


def _take(entries: List[Entry], n: int, whole_groups: bool) -> List[Entry]:
    """The first ``n`` entries, or the longest run of whole groups that fits in ``n``."""
    if not whole_groups:
        return entries[:n]
    groups: List[List[Entry]] = []
    for entry in entries:
        last = groups[-1] if groups else None
        if last and last[0].step == entry.step and last[0].exp.group_id == entry.exp.group_id:
            last.append(entry)
        else:
            groups.append([entry])
    taken: List[Entry] = []
    for group in groups:
        if taken and len(taken) + len(group) > n:
            break
        taken.extend(group)
        if len(taken) >= n:
            break
    return taken
