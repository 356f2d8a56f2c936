"""What a workflow runner is doing, reported on the console every
``explorer.runner_state_report_interval`` seconds (0: never).

A runner records each task it starts and finishes; a daemon thread sends one line a period
to the run's status board (fire-and-forget, so a slow console never holds a task up): the
tasks running with their age and attempt, and how many finished and failed so far. A runner
with nothing running and nothing new since its last line stays quiet.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional, Tuple

# Tasks named on one status line at most (a long line would wrap on the console).
SHOWN_TASKS = 3


class RunnerState:
    """Thread-safe record of one runner's tasks (threads and coroutines alike call it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Dict[int, Tuple[str, float, int]] = {}  # key -> (task id, start, attempt)
        self.finished = 0
        self.failed = 0
        self._reported: Optional[Tuple[int, int]] = None  # (finished, failed) at the last line

    def attempt(self, key: int, task_id: str, attempt: int) -> None:
        """Task ``task_id`` (``key``: unique while it runs) starts attempt ``attempt``."""
        with self._lock:
            start = self._running.get(key, (task_id, time.monotonic(), 0))[1]
            self._running[key] = (task_id, start, attempt)

    def end(self, key: int, ok: Optional[bool]) -> None:
        """The task ended: succeeded, failed after its retries, or (None) was given up on."""
        with self._lock:
            self._running.pop(key, None)
            self.finished += ok is True
            self.failed += ok is False

    def line(self) -> Optional[str]:
        """The status line, or None when idle with nothing new since the last one."""
        with self._lock:
            now, running = time.monotonic(), sorted(self._running.values(), key=lambda r: r[1])
            counts = (self.finished, self.failed)
            if not running and counts == self._reported:
                return None
            self._reported = counts
        shown = ", ".join(
            f"{task_id} {now - start:.0f}s" + (f" (attempt {attempt})" if attempt > 1 else "")
            for task_id, start, attempt in running[:SHOWN_TASKS]
        )
        more = f" and {len(running) - SHOWN_TASKS} more" if len(running) > SHOWN_TASKS else ""
        doing = f"{len(running)} running: {shown}{more}" if running else "idle"
        return f"{doing}; {self.finished} finished, {self.failed} failed so far"


def start_reporting(state: RunnerState, report: Any, interval: float) -> threading.Event:
    """Send ``state``'s line through ``report`` (a ``Reporter``) every ``interval`` seconds,
    from a daemon thread, until the returned event is set (a runner in a Ray actor never
    sets it: the thread lives as long as the process)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            line = state.line()
            if line is not None:
                report.event(line)

    threading.Thread(target=loop, name="runner-state", daemon=True).start()
    return stop
