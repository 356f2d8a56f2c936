"""StoreFollower: a trainer reading the store another process (an explore run) writes, on
SQLite and on PostgreSQL."""

import time

import pytest

from trinity.buffer import SQLExperienceStore
from trinity.buffer.store_follower import StoreFollower
from trinity.common.experience import Experience

NEVER = 3600.0  # poll interval of followers the tests poll by hand


def exp(i: int, group: str = "") -> Experience:
    return Experience(tokens=[1, 2, 3 + i], prompt_length=2, eid=f"e-{i}", group_id=group)


def eids(exps) -> list:
    return [e.eid for e in exps]


@pytest.fixture
def stores(database):
    """(explorer's store, the database for the trainer's): two connections to one database,
    a SQLite file, then a real PostgreSQL server (tests/conftest.py)."""
    writer = SQLExperienceStore(database, "eb")
    yield writer, database
    writer.close()


def follower_of(path: str, rewind_to=None, poll_s: float = NEVER) -> StoreFollower:
    return StoreFollower(SQLExperienceStore(path, "eb"), rewind_to, poll_s=poll_s)


def test_steps_written_before_and_after_start_are_read_once(stores):
    writer, path = stores
    writer.add([exp(0), exp(1)], step=1)
    follower = follower_of(path)
    q = follower.queue
    assert q.last_step() == 1 and eids(q.get(4, max_step=1, consumer=1).experiences) == [
        "e-0",
        "e-1",
    ]
    writer.add([exp(2)], step=2)
    writer.add([], step=3)  # a step whose tasks all failed still finishes
    follower.poll()
    follower.poll()  # a second look adds nothing twice
    result = q.get(4, max_step=3, consumer=2)
    assert eids(result.experiences) == ["e-2"] and result.state == "steps_done"
    # the store says who read what
    assert writer.unconsumed() == [] and sorted(writer.finished_steps()) == [1, 2, 3]
    follower.stop()


def test_a_read_waits_for_an_unfinished_step_and_names_it(stores):
    writer, path = stores
    writer.add([exp(0)], step=1)
    follower = follower_of(path)
    result = follower.queue.get(2, max_step=2, timeout=0.05, take_partial=False)
    assert result.state == "timeout" and result.waiting_for == 2 and result.experiences == []
    writer.add([exp(1)], step=2)
    follower.poll()
    assert eids(follower.queue.get(2, max_step=2, timeout=0.05).experiences) == ["e-0", "e-1"]
    follower.stop()


def test_the_polling_thread_feeds_a_waiting_read(stores):
    writer, path = stores
    follower = follower_of(path, poll_s=0.05)
    writer.add([exp(0), exp(1)], step=1)
    result = follower.queue.get(2, max_step=1, timeout=30)  # returns once the poll saw it
    assert eids(result.experiences) == ["e-0", "e-1"] and result.state == "full"
    follower.stop()


def test_the_end_mark_closes_the_queue_after_what_was_written(stores):
    writer, path = stores
    follower = follower_of(path)
    writer.add([exp(0)], step=1)
    writer.set_explorer_finished(True)
    follower.poll()
    first = follower.queue.get(4, max_step=5, consumer=1)
    assert eids(first.experiences) == ["e-0"] and first.state == "ended"
    last = follower.queue.get(4, max_step=5, consumer=2)
    assert last.experiences == [] and last.state == "ended"
    writer.set_explorer_finished(False)  # an explorer that starts again clears it
    assert not writer.explorer_finished()
    follower.stop()


def test_a_restarted_trainer_rereads_only_what_its_lost_steps_took(stores):
    writer, path = stores
    for step in (1, 2, 3):
        writer.add([exp(2 * step), exp(2 * step + 1)], step=step)
    first = follower_of(path)
    for train_step in (1, 2, 3):
        got = first.queue.get(2, max_step=train_step, consumer=train_step)
        assert len(got.experiences) == 2
    first.stop()  # killed after train step 3; its checkpoint is of step 1
    second = follower_of(path, rewind_to=1)
    again = second.queue.get(10, max_step=3, consumer=2)
    assert eids(again.experiences) == ["e-4", "e-5", "e-6", "e-7"]
    assert writer.unconsumed() == []
    second.stop()


def test_group_reads_take_whole_groups(stores):
    writer, path = stores
    writer.add([exp(0, "a"), exp(1, "a"), exp(2, "b"), exp(3, "b")], step=1)
    follower = follower_of(path)
    got = follower.queue.get(3, max_step=1, whole_groups=True, consumer=1)
    assert eids(got.experiences) == ["e-0", "e-1"]
    follower.stop()


def test_rows_written_while_reading_are_each_read_once(stores):
    """The explorer writes while the trainer reads: written N, read N, no id twice."""
    writer, path = stores
    follower = follower_of(path, poll_s=0.01)
    read = []
    for step in range(1, 21):
        writer.add([exp(10 * step + k) for k in range(3)], step=step)
        time.sleep(0.005)
        read += follower.queue.get(2, max_step=step, timeout=0.0, consumer=step).experiences
    writer.set_explorer_finished(True)
    while (result := follower.queue.get(5, timeout=30, consumer=99)).experiences:
        read += result.experiences
    assert result.state == "ended"
    assert len(read) == 60 and len(set(eids(read))) == 60
    follower.stop()
