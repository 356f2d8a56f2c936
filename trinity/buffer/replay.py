"""Experience replay for the experience queue (``experience_buffer.replay_buffer``).

A train step's read takes fresh experiences first, exactly as without replay (the step
accounting of ``queue.py`` decides which and how many), and fills the rest of the batch with
experiences earlier steps already trained on whose cooldown (``reuse_cooldown_time``
seconds since their last use) has passed, highest priority first (``priority.py``). Fresh
rows are not ranked against replays: every fresh row is trained on in the step it would be
trained on without replay, once, so runs with and without replay see the same fresh data and
the same schedule; a replay only ever takes a place that would otherwise stay empty.

A replay never waits: what is not ready when the read returns is not used. With whole
groups (group advantages), a group is replayed whole or not at all. Each experience handed
out carries ``info["use_count"]``: 1 for fresh rows, more for replays.

Use counts and last-use times live in the store (one row per use, tagged with the train
step), so a resumed run keeps them and a rewind to a checkpoint forgets the uses of the
train steps it undoes. Only the candidates' metadata is held in memory; their data is read
back from the store when they are replayed (kept in memory only without a store).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from trinity.buffer.priority import build_priority_fn
from trinity.common.experience import Experience

if TYPE_CHECKING:
    from trinity.buffer.queue import Entry
    from trinity.buffer.store import SQLExperienceStore

# Read states after which replays fill the batch: the accounting ended the read. A read cut
# short by max_read_timeout is not padded, so the console still reports the late explorer.
FILL_STATES = ("full", "steps_done", "ended")


@dataclass(slots=True)  # one per consumed row of the run: keep it small
class Candidate:
    """A consumed experience that may be replayed."""

    seq: int  # write order (the store id, or a counter without a store)
    id: Optional[int]  # store row id
    step: int  # explore step that produced it
    group_id: str
    model_version: int
    use_count: int  # train steps that used it so far
    ready_at: float  # unix time its cooldown ends
    priority: float
    exp: Optional[Experience]  # only without a store


class ReplayPool:
    """The consumed experiences of a queue that may be trained on again, and their uses.

    ``cooldown``: seconds after a use before the next (None: never reused). ``priority_fn``
    and ``priority_fn_args`` as in the configuration guide. ``rewind_to``: forget uses by
    train steps after it (the queue un-consumes their fresh rows at the same time).
    """

    def __init__(
        self,
        cooldown: Optional[float],
        priority_fn: str = "linear_decay",
        priority_fn_args: Optional[Dict[str, Any]] = None,
        store: Optional[SQLExperienceStore] = None,
        rewind_to: Optional[int] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cooldown = cooldown
        self.fn = build_priority_fn(priority_fn, dict(priority_fn_args or {}))
        self.store = store
        self.clock = clock
        self._pool: Dict[int, Candidate] = {}
        self._counter = itertools.count()
        if store is not None and cooldown is not None:
            self._restore(store, rewind_to)

    @classmethod
    def from_config(
        cls, config: Any, store: Optional[SQLExperienceStore], rewind_to: Optional[int]
    ) -> ReplayPool:
        """From a ``ReplayBufferConfig``."""
        return cls(
            config.reuse_cooldown_time,
            config.priority_fn,
            config.priority_fn_args,
            store,
            rewind_to,
        )

    def _restore(self, store: SQLExperienceStore, rewind_to: Optional[int]) -> None:
        if rewind_to is not None:
            store.forget_uses_after(rewind_to)
        for row_id, step, group_id, version, uses, last_used in store.replay_candidates():
            # rows consumed before replay was enabled have no recorded use: one, long ago
            count = max(1, uses)
            if self.fn.reusable(count):
                ready = (last_used or 0.0) + self.cooldown
                self._insert(row_id, row_id, step, group_id, version, count, ready, None)

    def serve(
        self, taken: Sequence[Entry], n: int, state: str, whole_groups: bool, consumer: int
    ) -> List[Experience]:
        """The fresh rows a read took, then replays up to ``n`` rows in all; records the
        uses by train step ``consumer``."""
        now = self.clock()
        fill = state in FILL_STATES and (taken or state != "ended")
        chosen = self._choose(n - len(taken), whole_groups, now) if fill else []
        replays = self._load(chosen)
        for candidate in chosen:
            self._used_again(candidate, now)
        fresh = [self._first_use(entry, now) for entry in taken]
        if self.store is not None and self.cooldown is not None:
            ids = [e.id for e in taken] + [c.id for c in chosen]
            self.store.record_uses([i for i in ids if i is not None], consumer, now)
        return fresh + [_tagged(exp, c.use_count) for exp, c in zip(replays, chosen, strict=True)]

    def size(self) -> int:
        """Experiences that may still be replayed (cooling down or ready)."""
        return len(self._pool)

    def _choose(self, room: int, whole_groups: bool, now: float) -> List[Candidate]:
        """Ready candidates by priority (ties: the least recently used, then the oldest),
        whole groups with ``whole_groups``, at most ``room`` rows. A heap, not a sort: the
        pool holds every reusable row of the run, a read takes a batch's worth."""
        if room <= 0 or self.cooldown is None:
            return []
        ready = [c for c in self._pool.values() if c.ready_at <= now]
        if not whole_groups:
            return heapq.nsmallest(room, ready, key=_rank)
        heap = [(_group_rank(unit), unit) for unit in _groups(ready)]
        heapq.heapify(heap)
        chosen: List[Candidate] = []
        while heap and len(chosen) < room:
            _, unit = heapq.heappop(heap)
            if len(chosen) + len(unit) <= room:  # else a smaller group may still fit
                chosen += unit
        return chosen

    def _load(self, chosen: List[Candidate]) -> List[Experience]:
        if self.store is None:
            return [c.exp for c in chosen]
        found = self.store.experiences([c.id for c in chosen])
        return [found[c.id] for c in chosen]

    def _used_again(self, candidate: Candidate, now: float) -> None:
        candidate.use_count += 1
        if self.fn.reusable(candidate.use_count):
            candidate.priority = self.fn.priority(candidate.model_version, candidate.use_count)
            candidate.ready_at = now + self.cooldown
        else:
            del self._pool[candidate.seq]

    def _first_use(self, entry: Entry, now: float) -> Experience:
        exp = entry.exp
        if self.cooldown is not None and self.fn.reusable(1):
            seq = entry.id if entry.id is not None else next(self._counter)
            held = exp if self.store is None else None
            ready = now + self.cooldown
            self._insert(seq, entry.id, entry.step, exp.group_id, exp.model_version, 1, ready, held)
        return _tagged(exp, 1)

    def _insert(
        self,
        seq: int,
        row_id: Optional[int],
        step: int,
        group_id: str,
        version: int,
        use_count: int,
        ready_at: float,
        exp: Optional[Experience],
    ) -> None:
        priority = self.fn.priority(version, use_count)
        self._pool[seq] = Candidate(
            seq, row_id, step, group_id, version, use_count, ready_at, priority, exp
        )


def _rank(candidate: Candidate) -> Tuple[float, float, int]:
    return (-candidate.priority, candidate.ready_at, candidate.seq)


def _group_rank(group: List[Candidate]) -> Tuple[float, float, int]:
    """A group's mean priority (its rows differ only by ``sigma`` noise), then its first row's."""
    return (-sum(c.priority for c in group) / len(group), group[0].ready_at, group[0].seq)


def _groups(ready: List[Candidate]) -> List[List[Candidate]]:
    """The candidates by (explore step, group id), rows in write order."""
    groups: Dict[Tuple[int, str], List[Candidate]] = {}
    for candidate in sorted(ready, key=lambda c: c.seq):
        groups.setdefault((candidate.step, candidate.group_id), []).append(candidate)
    return list(groups.values())


def _tagged(exp: Experience, use_count: int) -> Experience:
    """A shallow copy with ``info["use_count"]``: the pool's own object stays as it was."""
    out = copy.copy(exp)
    out.info = {**exp.info, "use_count": use_count}
    return out
