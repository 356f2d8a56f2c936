"""The experience queue a stage's explorer writes and its trainer reads, as one object: a
Ray actor (``actors.QueueActor``) or, in a stage that runs in one process, this object
itself (``ExperienceQueue`` is thread-safe).

In ``mode: serve`` it also keeps the served responses (``buffer/responses.py``): the
endpoint records, rewards and commits them here, where a commit becomes a queue step.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple


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
        serving: bool = False,
    ) -> None:
        """``replay``: the ``ReplayBufferConfig`` when replay is on, else None. ``follow``:
        another process (an ``explore`` run) writes the store; poll it (a ``train`` run).
        ``serving``: keep the responses a ``mode: serve`` endpoint serves, in the same
        database (table ``<table>_responses``)."""
        from trinity.buffer import ExperienceQueue, SQLExperienceStore
        from trinity.buffer.store_follower import StoreFollower

        store = SQLExperienceStore(database, table) if database else None
        if follow and store is not None:
            self.follower = StoreFollower(store, rewind_to)
            self.queue = self.follower.queue
        else:
            self.queue = ExperienceQueue(store=store, rewind_to=rewind_to, replay=replay)
        self.responses = None
        # one commit at a time (each takes the next step), and no feedback during one
        self._commits = threading.Lock()
        if serving and database:
            from trinity.buffer.responses import ResponseLog

            self.responses = ResponseLog(database, table)
            self._write_lost_commits()

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

    # ---- mode serve: the endpoint's responses (buffer/responses.py) -----------------------
    def record(self, response_id: str, exps: List[Any]) -> None:
        self.responses.record(response_id, exps)

    def feedback(
        self, response_ids: List[str], reward: float, task_id: Optional[str], run_id: int
    ) -> Any:
        """``ResponseLog.feedback``: a ``FeedbackResult``. Under the commit lock: a commit
        between its check and its write would leave a committed reply's reward changed."""
        with self._commits:
            return self.responses.feedback(response_ids, reward, task_id, run_id)

    def commit(self, task_id: Optional[str] = None) -> Tuple[int, int]:
        """(step, experiences) of a commit of the rewarded responses (of ``task_id``, or
        all) as the queue's next step; (0, 0) when there is none."""
        with self._commits:
            step = self.queue.last_step() + 1
            exps = self.responses.commit(step, task_id)
            if exps:
                self.queue.put(exps, step)
            return (step, len(exps)) if exps else (0, 0)

    def serve_counts(self) -> Dict[str, int]:
        """Choices served, rewarded and waiting, committed; the last committed step."""
        return {**self.responses.counts(), "step": self.queue.last_step()}

    def _write_lost_commits(self) -> None:
        """A commit is marked in the response log, then written as a queue step: a run that
        died between the two writes the step now (once: a written step is never again)."""
        written = set(self.queue.store.finished_steps())
        for step in self.responses.committed_steps():
            if step not in written:
                self.queue.put(self.responses.committed(step), step)
