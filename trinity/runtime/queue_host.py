"""The experience queue a stage's explorer writes and its trainer reads, as one object: a
Ray actor (``actors.QueueActor``) or, in a stage that runs in one process, this object
itself (``ExperienceQueue`` is thread-safe)."""

from __future__ import annotations

from typing import Any, List, Optional


class QueueHost:
    """The queue persisted in table ``table`` of ``database`` (a SQLite file or any
    SQLAlchemy URL), or, with ``follow``, the store another process writes."""

    def __init__(
        self,
        database: Optional[str],
        table: str = "experiences",
        rewind_to: Optional[int] = None,
        replay: Any = None,
        follow: bool = False,
    ) -> None:
        """``replay``: the ``ReplayBufferConfig`` when replay is on, else None. ``follow``:
        another process (an ``explore`` run) writes the store; poll it (a ``train`` run)."""
        from trinity.buffer import ExperienceQueue, SQLExperienceStore
        from trinity.buffer.store_follower import StoreFollower

        store = SQLExperienceStore(database, table) if database else None
        if follow and store is not None:
            self.follower = StoreFollower(store, rewind_to)
            self.queue = self.follower.queue
        else:
            self.queue = ExperienceQueue(store=store, rewind_to=rewind_to, replay=replay)

    def put(self, exps: List[Any], step: int) -> None:
        self.queue.put(exps, step)

    def get(self, n: int, **kwargs: Any) -> Any:
        """``ExperienceQueue.get``: a ``ReadResult``."""
        return self.queue.get(n, **kwargs)

    def last_step(self) -> int:
        return self.queue.last_step()

    def close(self) -> None:
        self.queue.close()

    def size(self) -> int:
        return self.queue.size()

    def set_explorer_finished(self, finished: bool) -> None:
        """The end mark a decoupled ``train`` run stops at (``store_follower.py``)."""
        if self.queue.store is not None:
            self.queue.store.set_explorer_finished(finished)
