"""A weight sync that stalls fails at ``synchronizer.sync_timeout`` naming the engine and the
phase it was in, never as a hang (``ExplorerRole._load_into`` over engines in this process)."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from trinity.common.weights import SyncTimeoutError
from trinity.runtime.explorer_role import ExplorerRole
from trinity.utils.loop_host import LoopHost


class Engine:
    """``delay``: seconds its load takes; ``arrive``: seconds before the weights reach it
    (the ``send`` phase: it is not loading yet)."""

    def __init__(self, delay=0.0, arrive=0.0):
        self.delay, self.arrive, self.loading, self.version = delay, arrive, False, 0

    async def load_weights(self, weights, version):
        await asyncio.sleep(self.arrive)
        self.loading = True
        await asyncio.sleep(self.delay)
        self.loading, self.version = False, version

    async def sync_phase(self):
        return "load" if self.loading else "idle"


def role(*engines, timeout=1.0):
    hosts = [LoopHost(lambda e=e: e, f"engine-{i}") for i, e in enumerate(engines)]
    config = SimpleNamespace(synchronizer=SimpleNamespace(sync_timeout=timeout))
    return SimpleNamespace(config=config, engines=hosts), hosts


def test_engines_that_load_in_time_pass():
    fast = [Engine(0.05), Engine(0.1)]
    me, hosts = role(*fast)
    ExplorerRole._load_into(me, hosts, {"w": 1}, 3)
    assert [e.version for e in fast] == [3, 3]


def test_a_stalled_load_names_the_engine_and_its_phase_at_the_timeout():
    me, hosts = role(Engine(0.05), Engine(delay=30), Engine(arrive=30))
    start = time.monotonic()
    with pytest.raises(SyncTimeoutError) as info:
        ExplorerRole._load_into(me, hosts, {"w": 1}, 4)
    assert time.monotonic() - start < 5  # the timeout (1 s), not the stall (30 s)
    assert str(info.value) == (
        "model version 4 did not reach rollout engine 1 (phase load: it was still loading "
        "them), rollout engine 2 (phase send: the weights had not reached it) within "
        "synchronizer.sync_timeout=1s; see the engine's log"
    )
