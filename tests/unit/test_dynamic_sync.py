"""Dynamic synchronisation without Ray: who waits for whom in each ``sync_style``, what a
train step may read, the explorer's requests, over_rollout's and dynamic_timeout's rules."""

import asyncio

import pytest

from trinity.common.sync_schedule import (
    Wanted,
    last_readable_step,
    readable_bound,
    wanted_before,
)
from trinity.explorer.pool_rules import DynamicTimeout, OverRollout, min_tasks
from trinity.runtime.synchronizer import Synchronizer


def _wants(style, interval, offset, steps=7):
    return [wanted_before(s, style, interval, offset) for s in range(1, steps + 1)]


def test_fixed_waits_for_the_required_version():
    assert [w.version for w in _wants("fixed", 2, 0)] == [0, 0, 2, 2, 4, 4, 6]
    assert not any(w.ask or w.final for w in _wants("fixed", 2, 0))


def test_explorer_driven_asks_after_every_interval_and_never_waits():
    wants = _wants("explorer_driven", 2, 0)
    # version 0 is always published: "at least 0" loads the newest without waiting
    assert [w.version for w in wants] == [0] * 7
    assert [s for s, w in enumerate(wants, 1) if w.ask] == [3, 5, 7]  # after steps 2, 4, 6
    # sync_offset: the first offset steps keep the starting weights, the asks move with them
    wants = _wants("explorer_driven", 2, 1)
    assert [w.version for w in wants] == [None, 0, 0, 0, 0, 0, 0]
    assert [s for s, w in enumerate(wants, 1) if w.ask] == [4, 6]


def test_trainer_driven_loads_whatever_is_newest_at_each_step():
    assert _wants("trainer_driven", 3, 0) == [Wanted(0)] * 7
    assert _wants("trainer_driven", 3, 2)[:3] == [Wanted(None), Wanted(None), Wanted(0)]


def test_max_staleness_makes_a_dynamic_style_wait_for_weights_fresh_enough():
    """Explore step s is read by train step s, which updates version s - 1: with bound b it
    needs version s - 1 - b (earlier weights would give experiences only to be dropped)."""
    for style in ("explorer_driven", "trainer_driven", "fully_async"):
        wants = [wanted_before(s, style, 1, 0, 2) for s in range(1, 7)]
        assert [w.version for w in wants] == [0, 0, 0, 1, 2, 3]
    # the starting weights' steps (sync_offset) keep them; fixed has its own schedule
    assert [wanted_before(s, "trainer_driven", 1, 2, 2).version for s in (1, 2, 3, 4)] == [
        None,
        None,
        0,
        1,
    ]
    assert wanted_before(5, "fixed", 1, 0, 0) == Wanted(4)


def test_explorer_driven_gets_the_version_it_waits_for_at_the_step_that_reaches_it():
    async def scenario():
        sync = Synchronizer("memory", "/unused", 10.0, has_trainer=True)
        await sync.need(3)
        # published at the end of train step 3, not before (nor again after)
        assert [await sync.take_ask(step) for step in (1, 2, 3, 4)] == [False, False, True, False]
        await sync.publish(3, ["w3"])
        await sync.need(2)  # published already: nothing to do
        assert not await sync.take_ask(5)

    asyncio.run(scenario())


def test_a_bound_below_the_publishing_interval_is_refused(tmp_path):
    from tests.unit.test_config_finalize import problems

    found = problems(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=trainer_driven",
            "synchronizer.sync_interval=4",
            "synchronizer.max_staleness=1",
        ],
    )
    assert found == [
        "synchronizer.max_staleness = 1 is below synchronizer.sync_interval - 1 = 3: with "
        "sync_style trainer_driven the trainer publishes every sync_interval steps, and the "
        "explorer would wait for weights the trainer can publish only after steps not explored "
        "yet; raise it to 3 or leave it unset"
    ]


def test_what_a_train_step_may_read():
    bound = readable_bound("fixed", 2, 1)
    assert [bound(t) for t in range(1, 5)] == [last_readable_step(t, 2, 1) for t in range(1, 5)]
    # the explorer never waits for the trainer: any explore step will come
    for style in ("explorer_driven", "trainer_driven"):
        assert readable_bound(style, 2, 1)(5) is None


def test_synchronizer_answers_an_ask_once_and_hands_over_the_last_weights():
    async def scenario():
        sync = Synchronizer("memory", "/unused", 10.0, has_trainer=True)
        assert not await sync.take_ask(1)
        await sync.ask()
        assert await sync.take_ask(1) and not await sync.take_ask(2)  # one answer per ask
        assert await sync.wait_for(0, 0.0) == (0, [])  # never waits for version 0
        assert await sync.wait_finished(0.05) is None  # the trainer still runs
        await sync.publish(3, ["w3"])
        finished = asyncio.ensure_future(sync.wait_finished(5.0))
        await asyncio.sleep(0)
        assert not finished.done()
        await sync.publish(4, ["w4"])
        await sync.trainer_finished()
        assert await finished == (4, ["w4"])

    asyncio.run(scenario())


def test_wait_finished_raises_when_the_trainer_failed():
    async def scenario():
        sync = Synchronizer("memory", "/unused", 10.0, has_trainer=True)
        await sync.trainer_finished("boom")
        with pytest.raises(RuntimeError, match="the trainer stopped before its end: failed: boom"):
            await sync.wait_finished(1.0)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "batch,ratio,expected", [(8, 0.0, 8), (8, 0.5, 4), (10, 0.7, 3), (10, 0.25, 8), (3, 0.9, 1)]
)
def test_min_tasks_is_the_ceiling_of_the_kept_fraction(batch, ratio, expected):
    # (1 - 0.7) * 10 = 3.0000000000000004 in floating point: still 3 tasks
    assert min_tasks(batch, ratio) == expected


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Piece:
    def __init__(self, task_id, n=1, is_eval=False):
        self.task_id, self.is_eval = task_id, is_eval
        self.rollout_args = type("Args", (), {"n": n})()


def test_over_rollout_counts_whole_tasks_then_waits_wait_after_min():
    clock = Clock()
    # task b is split into two pieces (max_repeat_times_per_runner)
    pieces = [Piece("a"), Piece("b"), Piece("b"), Piece("c")]
    rule = OverRollout(pieces, enough=2, wait_after_min=5.0, clock=clock)
    rule.finish(pieces[0])
    rule.finish(pieces[1])  # half of b: b is not finished
    assert rule.complete() == 1 and rule.seconds_left() is None and not rule.expired()
    clock.now = 103.0
    rule.finish(pieces[2])  # b complete: 2 tasks, the grace period starts now
    assert rule.complete() == 2 and rule.seconds_left() == 5.0
    clock.now = 107.5
    assert rule.seconds_left() == 0.5 and not rule.expired()
    clock.now = 108.0
    assert rule.expired()


def test_dynamic_timeout_follows_the_mean_successful_time_of_each_kind():
    timeout = DynamicTimeout(max_timeout=60.0, ratio=3.0)
    train, other_n, evaluation = Piece("t", n=8), Piece("u", n=2), Piece("e", is_eval=True)
    assert timeout.limit(train) == 60.0  # no success yet: max_timeout
    assert timeout.describe(train) == "explorer.max_timeout=60s"
    timeout.record(train, 2.0)
    timeout.record(train, 4.0)
    assert timeout.limit(train) == 9.0  # mean 3 s x 3
    assert timeout.describe(train).startswith("9s (explorer.dynamic_timeout: 3 x 3s, the mean")
    assert timeout.limit(other_n) == 60.0 and timeout.limit(evaluation) == 60.0
    timeout.record(evaluation, 30.0)
    assert timeout.limit(evaluation) == 60.0  # 90 s capped by max_timeout
    assert DynamicTimeout(60.0).limit(train) == 60.0  # off: always max_timeout
