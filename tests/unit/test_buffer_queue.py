"""ExperienceQueue: step accounting, whole groups, timeouts, close, SQLite persistence, rewind."""

import threading
import time

import pytest
import torch

from trinity.buffer import ExperienceQueue, SQLExperienceStore
from trinity.common.experience import Experience


def exp(i: int, group: str = "", source: str = "p") -> Experience:
    return Experience(
        tokens=[1, 2, 3 + i], prompt_length=2, reward=float(i), eid=f"{source}-{i}", group_id=group
    )


def eids(exps) -> list:
    return [e.eid for e in exps]


def test_fifo_order_across_steps():
    q = ExperienceQueue()
    q.put([exp(0), exp(1)], step=1)
    q.put([exp(2)], step=2)
    assert q.size() == 3 and q.last_step() == 2
    assert eids(q.get(2).experiences) == ["p-0", "p-1"]
    assert eids(q.get(1).experiences) == ["p-2"]


def test_a_step_is_written_once():
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    with pytest.raises(ValueError, match="already written"):
        q.put([exp(1)], step=1)


def test_a_short_step_is_returned_at_once_without_waiting():
    """Two of four tasks failed: the step is finished, so nothing more will come for it."""
    q = ExperienceQueue()
    q.put([exp(0, "a"), exp(1, "a")], step=1)
    start = time.monotonic()
    got = q.get(4, max_step=1, timeout=30)
    assert time.monotonic() - start < 1
    assert (eids(got.experiences), got.state) == (["p-0", "p-1"], "steps_done")


def test_an_empty_step_closes_it():
    q = ExperienceQueue()
    q.put([], step=1)
    got = q.get(4, max_step=1, timeout=30)
    assert (got.experiences, got.state) == ([], "steps_done")


def test_read_waits_for_an_unfinished_step_then_gets_it():
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    threading.Timer(0.1, lambda: q.put([exp(1), exp(2)], step=2)).start()
    got = q.get(3, max_step=2, timeout=10)
    assert (eids(got.experiences), got.state) == (["p-0", "p-1", "p-2"], "full")


def test_read_never_takes_steps_beyond_max_step():
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    q.put([exp(1)], step=2)
    got = q.get(2, max_step=1, timeout=10)
    assert eids(got.experiences) == ["p-0"]
    assert eids(q.get(5, max_step=2).experiences) == ["p-1"]


def test_timeout_names_the_step_and_takes_partial_only_when_asked():
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    waited = q.get(2, max_step=2, timeout=0.1, take_partial=False)
    assert (waited.experiences, waited.state, waited.waiting_for) == ([], "timeout", 2)
    assert q.size() == 1  # nothing was taken
    partial = q.get(2, max_step=2, timeout=0.1)
    assert (eids(partial.experiences), partial.state) == (["p-0"], "timeout")


def test_whole_groups_are_never_split():
    q = ExperienceQueue()
    q.put([exp(0, "a"), exp(1, "a"), exp(2, "b"), exp(3, "b"), exp(4, "c"), exp(5, "c")], step=1)
    # 5 would cut group "c"; the read takes a and b only, c stays for the next read
    assert eids(q.get(5, max_step=1, whole_groups=True).experiences) == ["p-0", "p-1", "p-2", "p-3"]
    assert eids(q.get(5, max_step=1, whole_groups=True).experiences) == ["p-4", "p-5"]


def test_a_group_larger_than_the_read_is_taken_alone():
    q = ExperienceQueue()
    q.put([exp(i, "a") for i in range(3)] + [exp(3, "b")], step=1)
    assert eids(q.get(2, max_step=1, whole_groups=True).experiences) == ["p-0", "p-1", "p-2"]


def test_same_group_id_in_two_steps_is_two_groups():
    q = ExperienceQueue()
    q.put([exp(0, "g")], step=1)
    q.put([exp(1, "g")], step=2)
    assert eids(q.get(1, max_step=2, whole_groups=True).experiences) == ["p-0"]


def test_close_releases_waiting_reader_then_ends():
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    threading.Timer(0.05, q.close).start()
    got = q.get(4, max_step=5)  # no timeout: close is what ends the wait
    assert (eids(got.experiences), got.state) == (["p-0"], "ended")
    assert q.get(1).experiences == [] and q.get(1).state == "ended"
    with pytest.raises(RuntimeError, match="closed"):
        q.put([exp(1)], step=2)


@pytest.mark.parametrize("url", [True, False], ids=["sqlite-url", "plain-path"])
def test_persistence_reloads_only_unconsumed_in_order(tmp_path, url):
    path = tmp_path / "sub" / "buffer.db"
    location = f"sqlite:///{path}" if url else str(path)
    q = ExperienceQueue(store=SQLExperienceStore(location))
    q.put([exp(i) for i in range(5)], step=1)
    q.put([], step=2)
    assert eids(q.get(2, consumer=1).experiences) == ["p-0", "p-1"]
    q.store.close()  # the process "crashes" here

    restarted = ExperienceQueue(store=SQLExperienceStore(location))
    assert restarted.size() == 3 and restarted.last_step() == 2
    restarted.put([exp(5)], step=3)
    got = restarted.get(4, max_step=3).experiences
    assert eids(got) == ["p-2", "p-3", "p-4", "p-5"]
    assert [e.reward for e in got] == [2.0, 3.0, 4.0, 5.0]
    assert torch.equal(got[0].tokens, torch.tensor([1, 2, 5]))
    restarted.store.close()


def test_rewind_puts_back_what_later_train_steps_consumed(tmp_path):
    """Killed after train step 3 with a checkpoint at step 1: steps 2-3's reads come back."""
    location = str(tmp_path / "q.db")
    q = ExperienceQueue(store=SQLExperienceStore(location))
    for step in (1, 2, 3, 4):
        q.put([exp(2 * step), exp(2 * step + 1)], step=step)
    for train_step in (1, 2, 3):
        q.get(2, max_step=train_step, consumer=train_step)
    q.store.close()
    resumed = ExperienceQueue(store=SQLExperienceStore(location), rewind_to=1)
    assert eids(resumed.get(10, max_step=4).experiences) == [f"p-{i}" for i in range(4, 10)]
    resumed.store.close()
    again = ExperienceQueue(store=SQLExperienceStore(location))
    assert again.size() == 0  # each experience read once after the rewind


def test_older_store_layout_is_refused(tmp_path):
    import sqlalchemy as sa

    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE experiences (id INTEGER PRIMARY KEY, consumed BOOL)"))
    with pytest.raises(ValueError, match="older Trinity version"):
        SQLExperienceStore(str(path))


def test_json_backup_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not supported yet"):
        SQLExperienceStore(str(tmp_path / "buffer.json"))


def test_concurrent_writer_and_reader_lose_nothing(tmp_path):
    q = ExperienceQueue(store=SQLExperienceStore(str(tmp_path / "q.db")))
    received = []

    def produce():
        for step in range(1, 21):
            q.put([exp(i, f"g{step}") for i in range(6 * step, 6 * step + 6)], step=step)
        q.close()

    def consume():
        train_step = 0
        while True:
            train_step += 1
            got = q.get(4, max_step=train_step + 20, whole_groups=True, consumer=train_step)
            if got.state == "ended" and not got.experiences:
                return
            received.extend(got.experiences)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert eids(received) == [f"p-{i}" for i in range(6, 126)]
    assert ExperienceQueue(store=SQLExperienceStore(str(tmp_path / "q.db"))).size() == 0


def test_a_last_step_written_empty_is_a_step_even_once_closed():
    """The explorer writes its last step empty (all filtered) and closes the queue before
    the trainer reads it: that read is the step (nothing to train on), the next is the end."""
    q = ExperienceQueue()
    q.put([exp(0)], step=1)
    q.put([], step=2)
    q.close()
    assert eids(q.get(4, max_step=1).experiences) == ["p-0"]
    got = q.get(4, max_step=2)
    assert (got.experiences, got.state) == ([], "steps_done")
    got = q.get(4, max_step=3)
    assert (got.experiences, got.state) == ([], "ended")
