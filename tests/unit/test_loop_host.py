"""LoopHost: an object's coroutine methods on a loop of their own thread, from any thread."""

import asyncio
import threading

from trinity.utils.loop_host import LoopHost


class Counter:
    """Made on the loop: its condition belongs to the loop, as a synchronizer's does."""

    def __init__(self) -> None:
        self.made_on = threading.current_thread().name
        self.value = 0
        self.changed = asyncio.Condition()

    async def add(self, n: int) -> int:
        async with self.changed:
            self.value += n
            self.changed.notify_all()
        return self.value

    async def wait_for(self, at_least: int) -> str:
        async with self.changed:
            await self.changed.wait_for(lambda: self.value >= at_least)
        return threading.current_thread().name

    def plain(self) -> str:
        return threading.current_thread().name

    async def hang(self) -> None:
        await asyncio.sleep(3600)


def test_coroutine_methods_run_on_the_hosts_loop_and_block_the_caller():
    host = LoopHost(Counter, "counter-loop")
    try:
        assert host.hosted.made_on == "counter-loop"
        assert host.add(2) == 2 and host.add(3) == 5
        assert host.plain() == threading.current_thread().name  # plain methods: caller's thread
    finally:
        host.close()


def test_a_waiter_in_one_thread_is_woken_by_a_call_from_another():
    host = LoopHost(Counter, "counter-loop")
    woken = []
    waiter = threading.Thread(target=lambda: woken.append(host.wait_for(4)))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive()  # nothing added yet: it waits on the loop, not in a busy loop
    host.add(4)
    waiter.join(timeout=5)
    assert woken == ["counter-loop"]
    host.close()


def test_submit_returns_a_future_and_close_cancels_what_still_runs():
    host = LoopHost(Counter, "counter-loop")
    assert host.submit("add", 7).result(timeout=5) == 7
    hanging = host.submit("hang")
    host.close()
    assert hanging.cancelled()
