"""What the run is waiting for, and what went wrong, for the console (docs/design-notes.md,
"Step accounting and failures").

Roles report through a ``Reporter``; the launcher polls the ``RunStatus`` board (a Ray actor in
a real run) once a second and prints new events at once and waits that last more than a few
seconds. Nothing here blocks a role: reports are fire-and-forget.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple


class RunStatus:
    """The board: one current wait per role, and an append-only list of events."""

    def __init__(self) -> None:
        self.waits: Dict[str, Tuple[str, float]] = {}  # role -> (what, since: unix time)
        self.events: List[Tuple[str, str]] = []  # (role, text)

    def wait(self, role: str, what: str, since: Optional[float] = None) -> None:
        self.waits[role] = (what, since if since is not None else time.time())

    def done(self, role: str) -> None:
        self.waits.pop(role, None)

    def event(self, role: str, text: str) -> None:
        self.events.append((role, text))

    def snapshot(self, seen: int) -> Tuple[Dict[str, Tuple[str, float]], List[Tuple[str, str]]]:
        """The current waits and the events after the first ``seen``."""
        return dict(self.waits), self.events[seen:]


class Reporter:
    """A role's handle on the board: a local ``RunStatus``, a Ray actor of one, or nothing."""

    def __init__(self, board: Any, role: str) -> None:
        self.board, self.role = board, role
        self.waiting: Optional[str] = None

    def _send(self, method: str, *args: Any) -> None:
        if self.board is None:
            return
        target = getattr(self.board, method)
        if hasattr(target, "remote"):
            target.remote(self.role, *args)
        else:
            target(self.role, *args)

    def wait(self, what: str, since: Optional[float] = None) -> None:
        """Say what this role waits for (sent again only when it changes)."""
        if what != self.waiting:
            self.waiting = what
            self._send("wait", what, since)

    def done(self) -> None:
        if self.waiting is not None:
            self.waiting = None
            self._send("done")

    def event(self, text: str) -> None:
        self._send("event", text)
