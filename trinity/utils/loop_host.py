"""An object hosted on an event loop of its own thread: what an async Ray actor is, in this
process (``local_stage.py``, ``trinity debug``).

Its coroutine methods run on the host's loop, so calls from many threads meet there (an
engine batches them, a synchronizer's conditions see them all); ``host.method(*args)``
blocks until the loop has the answer, ``host.submit("method", *args)`` returns a
``concurrent.futures.Future`` instead (what an async caller awaits). Plain methods run in
the calling thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from typing import Any, Callable


class LoopHost:
    def __init__(self, make: Callable[[], Any], name: str) -> None:
        """``make()`` builds the hosted object; it runs on the loop (an object that creates
        asyncio primitives or tasks binds them to it)."""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name=name, daemon=True).start()
        self.hosted = self.run(_call(make))

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop; its result, from any other thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, method: str, *args: Any) -> concurrent.futures.Future:
        """The hosted object's ``method(*args)`` on the loop, as a future."""
        return asyncio.run_coroutine_threadsafe(
            _call(getattr(self.hosted, method), *args), self.loop
        )

    def __getattr__(self, name: str) -> Callable:
        """The hosted object's method ``name`` (same signature, so a caller that inspects it
        sees the parameters it looks for), blocking until the loop ran it. Made once: it is
        kept as an attribute, so later lookups (every engine call) do not come here."""
        if name.startswith("_") or name == "hosted":  # not set yet: nothing to ask
            raise AttributeError(name)
        method = getattr(self.hosted, name)

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return self.run(result) if inspect.iscoroutine(result) else result

        setattr(self, name, call)
        return call

    def close(self, wait: bool = True) -> None:
        """Cancel what still runs on the loop (servers, batching), then stop it; ``wait``:
        until the cancelled tasks have ended (a task stuck in a blocking call never does)."""
        cancelled = asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop)
        cancelled.add_done_callback(lambda _: self.loop.call_soon_threadsafe(self.loop.stop))
        if wait:
            cancelled.result()


async def _call(fn: Callable, *args: Any) -> Any:
    result = fn(*args)
    return await result if inspect.iscoroutine(result) else result


async def _cancel_others() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
