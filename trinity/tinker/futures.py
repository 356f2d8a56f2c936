"""Futures: every request that does work returns a request id at once; the SDK polls it.

A ``Future`` is created on the event loop when its request arrives, completed on the worker
thread when its work is done (``complete``/``fail``), and read by ``retrieve_future``, which
waits up to ``LONG_POLL_S`` for it before answering ``try_again`` (the SDK then asks again
at once, logging a warning; its own timeout per poll is 45 s). A result stays readable for
``KEEP_S`` after it was first read (the SDK may read it twice: after a lost reply, or a
metadata-only peek), then it is dropped; one nobody reads (its client gone) is dropped
``UNREAD_S`` after it was done.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from trinity.tinker.errors import TinkerError, not_found

LONG_POLL_S = 30.0
KEEP_S = 600.0
UNREAD_S = 3600.0


@dataclass
class Future:
    request_id: str
    kind: str  # the SDK's request type, for messages: "ForwardBackward", "Sample", ...
    loop: asyncio.AbstractEventLoop
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None  # what the work returned (rendered by the route that serves it)
    error: Optional[TinkerError] = None
    read_at: Optional[float] = None
    done_at: Optional[float] = None


class FutureStore:
    """The futures of one server, by request id."""

    def __init__(self) -> None:
        self._futures: Dict[str, Future] = {}
        self._lock = threading.Lock()
        self._prefix = uuid.uuid4().hex[:8]
        self._counter = itertools.count()

    def create(self, kind: str) -> Future:
        """A new pending future (call on the event loop)."""
        request_id = f"{self._prefix}-{next(self._counter)}"
        future = Future(request_id, kind, asyncio.get_running_loop())
        with self._lock:
            self._drop_old()
            self._futures[request_id] = future
        return future

    def complete(self, future: Future, result: Any) -> None:
        """Set the result (any thread)."""
        future.result, future.done_at = result, time.monotonic()
        future.loop.call_soon_threadsafe(future.done.set)

    def fail(self, future: Future, error: TinkerError) -> None:
        """Set the failure (any thread)."""
        future.error, future.done_at = error, time.monotonic()
        future.loop.call_soon_threadsafe(future.done.set)

    async def wait(self, request_id: str, timeout: float = LONG_POLL_S) -> Optional[Future]:
        """The future, once done, or None if it is still pending after ``timeout``."""
        with self._lock:
            future = self._futures.get(request_id)
        if future is None:
            raise not_found("request_id", request_id, "future (unknown, or read long ago)")
        try:
            await asyncio.wait_for(future.done.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        if future.read_at is None:
            future.read_at = time.monotonic()
        return future

    def pending(self) -> int:
        with self._lock:
            return sum(not f.done.is_set() for f in self._futures.values())

    def _drop_old(self) -> None:
        now = time.monotonic()
        stale = [
            rid
            for rid, f in self._futures.items()
            if (f.read_at is not None and now - f.read_at > KEEP_S)
            or (f.done_at is not None and now - f.done_at > UNREAD_S)
        ]
        for rid in stale:
            del self._futures[rid]
