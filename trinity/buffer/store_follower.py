"""The trainer's side of an experience store that another process writes (decoupled runs).

A ``train`` run reading a ``queue``/``sql`` experience buffer shares neither a process nor a
Ray cluster with the explorer filling it: an ``explore`` run writes the store, and this
follower polls it, handing each newly finished explore step and its rows to a local
``ExperienceQueue``. The trainer then reads exactly as in a ``both`` run (``queue.py``: it
waits only for steps that will come, takes whole groups, and every read records its train
step in the store, so a resumed trainer re-reads only what its lost steps took). When the
explorer's end mark appears, the queue is closed once everything written before the mark
is in it: the trainer drains it and stops.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from trinity.buffer.queue import ExperienceQueue
from trinity.buffer.store import SQLExperienceStore

logger = logging.getLogger("trinity.buffer")

# Seconds between two looks at the store: a train step takes far longer, so this adds little.
POLL_S = 1.0


class StoreFollower:
    """Keeps ``self.queue`` up to date with a store written by another process."""

    def __init__(
        self, store: SQLExperienceStore, rewind_to: Optional[int], poll_s: float = POLL_S
    ) -> None:
        """``rewind_to``: the trainer's checkpoint step; what later train steps read is put
        back (their updates were lost with the process that made them)."""
        self.store, self.poll_s = store, poll_s
        self.queue = ExperienceQueue(store=store, rewind_to=rewind_to)
        # Ids grow in commit order, so rows above the newest loaded one are the new ones.
        self.last_id = max(self.queue.held_ids(), default=0)
        self.error: Optional[str] = None
        # The queue loaded its rows before its finished steps: a step committed in between
        # is finished there without its rows. This first poll adds them before any read.
        self.poll()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="store-follower", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Take in what the explorer wrote since the last poll; close the queue at its end."""
        # Order matters: the end mark is set after the last step commits, and a step's rows
        # commit with its "finished" record, so each read below sees all the earlier ones.
        ended = self.store.explorer_finished()
        steps = self.store.finished_steps()
        rows = self.store.unconsumed_after(self.last_id)
        if rows:
            self.last_id = rows[-1][0]
        self.queue.add_written(rows, steps)
        if ended and not self.queue.closed:
            logger.info("the explorer has finished; the trainer reads what is left")
            self.queue.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s) and not self.queue.closed:
            try:
                self.poll()
            except (OSError, ValueError) as exc:  # StoreError, an undecodable row: say it once
                if str(exc) != self.error:
                    logger.error("reading the experience buffer failed (retrying): %s", exc)
                self.error = str(exc)
            else:
                self.error = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
