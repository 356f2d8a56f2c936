"""SQLExperienceStore on SQLite and on a real PostgreSQL server (tests/pg.py): persistence,
atomic steps, ids in write order under concurrent writer processes, and named errors."""

import multiprocessing
import time

import pytest
import sqlalchemy as sa

from tests.pg import PASSWORD
from trinity.buffer import ExperienceQueue, SQLExperienceStore
from trinity.buffer.store import StoreError
from trinity.common.experience import Experience


def exp(step: int, k: int) -> Experience:
    return Experience(
        tokens=[1, 2, 3 + k],
        prompt_length=2,
        reward=float(k),
        eid=f"s{step}-{k}",
        group_id=f"g{step}",
    )


def test_queue_on_the_store_persists_and_resumes(database):
    q = ExperienceQueue(store=SQLExperienceStore(database, "buf"))
    q.put([exp(1, k) for k in range(3)], step=1)
    q.put([], step=2)  # a step that produced nothing is still finished
    q.put([exp(3, 0)], step=3)
    assert [e.eid for e in q.get(2, consumer=1).experiences] == ["s1-0", "s1-1"]
    q.store.close()  # the process "crashes" here

    restarted = ExperienceQueue(store=SQLExperienceStore(database, "buf"))
    assert restarted.last_step() == 3 and restarted.size() == 2
    got = restarted.get(5, max_step=3).experiences
    assert [(e.eid, e.reward, e.tokens.tolist()) for e in got] == [
        ("s1-2", 2.0, [1, 2, 5]),
        ("s3-0", 0.0, [1, 2, 3]),
    ]
    restarted.store.close()
    rewound = SQLExperienceStore(database, "buf")
    assert rewound.unconsume_after(0) == 2  # what train step 1 read; step 0's stays read
    assert [e.eid for _, _, e in rewound.unconsumed()] == ["s1-0", "s1-1"]
    assert rewound.unconsume_after(-1) == 2
    assert [row[1] for row in rewound.unconsumed()] == [1, 1, 1, 3]
    assert sorted(rewound.finished_steps()) == [1, 2, 3]
    rewound.close()


def test_two_buffers_share_a_database_in_their_own_tables(database):
    first, second = SQLExperienceStore(database, "a"), SQLExperienceStore(database, "b")
    first.add([exp(1, 0)], 1)
    second.add([exp(1, 5), exp(1, 6)], 1)  # the same step number, another buffer
    assert [e.eid for _, _, e in first.unconsumed()] == ["s1-0"]
    assert [e.eid for _, _, e in second.unconsumed()] == ["s1-5", "s1-6"]
    first.close(), second.close()


def test_a_step_written_twice_fails_whole_and_keeps_the_first(database):
    store = SQLExperienceStore(database, "buf")
    ids = store.add([exp(1, 0), exp(1, 1)], 1)
    with pytest.raises(StoreError, match=r"explore step 1 .*table 'buf'.*written already"):
        store.add([exp(1, 7), exp(1, 8)], 1)
    assert [(i, e.eid) for i, _, e in store.unconsumed()] == list(
        zip(ids, ["s1-0", "s1-1"], strict=True)
    )
    assert PASSWORD not in str(store.where)
    store.close()


def _write_steps(url: str, writer: int, writers: int, steps: int, per_step: int) -> None:
    store = SQLExperienceStore(url, "buf")
    for step in range(writer + 1, steps + 1, writers):
        store.add([exp(step, k) for k in range(per_step)], step)
    store.close()


def test_concurrent_writer_processes_and_a_reader_lose_nothing_read_nothing_twice(database):
    """Three explorer processes write steps 1..24 (4 rows each) while this process reads and
    marks what it read, over and over. The tables are created by whichever process is first."""
    writers, steps, per_step = 3, 24, 4
    context = multiprocessing.get_context("fork")
    procs = [
        context.Process(target=_write_steps, args=(database, w, writers, steps, per_step))
        for w in range(writers)
    ]
    for proc in procs:
        proc.start()
    reader, reads, deadline = SQLExperienceStore(database, "buf"), [], time.monotonic() + 120
    while time.monotonic() < deadline:
        done = len(reader.finished_steps()) == steps  # before reading: the last read sees all
        rows = reader.unconsumed()
        if rows:
            reads.append(rows)
            reader.mark_consumed([row_id for row_id, _, _ in rows], by_step=len(reads))
        if done:
            break
        time.sleep(0.005)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    seen = [e.eid for rows in reads for _, _, e in rows]
    assert sorted(seen) == sorted(f"s{s}-{k}" for s in range(1, steps + 1) for k in range(per_step))
    assert len(seen) == len(set(seen))  # nothing read twice
    ids = [row_id for rows in reads for row_id, _, _ in rows]
    assert ids == sorted(ids)  # a later read never finds a row below one read before
    for rows in reads:  # a step is seen whole or not at all, its rows next to each other
        by_step = {}
        for row_id, step, e in rows:
            by_step.setdefault(step, []).append(row_id)
            assert e.eid.startswith(f"s{step}-")
        for step_ids in by_step.values():
            assert step_ids == list(range(step_ids[0], step_ids[0] + per_step))
    assert reader.unconsumed() == []
    reader.close()


def test_a_row_that_cannot_be_decoded_is_named(database):
    store = SQLExperienceStore(database, "buf")
    (good,) = store.add([exp(1, 0)], 1)
    (bad,) = store.add([exp(2, 0)], 2)
    with store.engine.begin() as conn:
        conn.execute(store.table.update().where(store.table.c.id == bad).values(data=b"junk"))
    with pytest.raises(ValueError) as info:
        store.unconsumed()
    text = str(info.value)
    assert f"table 'buf'), row id {bad}: not an encoded Experience" in text
    assert PASSWORD not in text and ("***" in text or database.startswith("sqlite"))
    store.close()


def test_a_table_with_other_columns_is_refused_by_name(database):
    engine = sa.create_engine(database)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE tasks (id INTEGER PRIMARY KEY, question TEXT)"))
    engine.dispose()
    with pytest.raises(ValueError, match=r"table 'tasks' exists without the column\(s\) \['eid'"):
        SQLExperienceStore(database, "tasks")


def test_a_legacy_experiences_table_is_not_silently_skipped(database):
    SQLExperienceStore(database, "experiences").close()  # the name every buffer used to get
    with pytest.raises(ValueError, match="ALTER TABLE experiences RENAME TO experience_buffer"):
        SQLExperienceStore(database, "experience_buffer")


def test_an_unreachable_server_is_named_without_its_password(postgres_server):
    dead = postgres_server.url().replace(f":{postgres_server.port}/", ":1/")
    with pytest.raises(StoreError) as info:
        SQLExperienceStore(dead, "buf")
    text = str(info.value)
    assert "postgresql+psycopg://trinity:***@127.0.0.1:1/postgres (table 'buf')" in text
    assert PASSWORD not in text
    with pytest.raises(StoreError, match="password authentication failed") as info:
        SQLExperienceStore(postgres_server.url(password="wrong-pw"), "buf")
    assert "wrong-pw" not in str(info.value)


def test_an_in_memory_sqlite_database_is_refused():
    with pytest.raises(ValueError, match="in-memory SQLite database"):
        SQLExperienceStore("sqlite://", "buf")


def test_a_locked_sqlite_file_fails_the_write_by_name_and_loses_nothing(tmp_path, monkeypatch):
    import sqlite3

    import trinity.utils.database as database

    monkeypatch.setattr(database, "LOCK_TIMEOUT_S", 0.2)  # instead of a minute
    path = tmp_path / "buf.db"
    store = SQLExperienceStore(str(path), "buf")
    store.add([exp(1, 0)], 1)
    other = sqlite3.connect(path)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the file
    with pytest.raises(StoreError) as info:
        store.add([exp(2, 0)], 2)
    assert str(info.value).startswith("cannot write explore step 2 to the experience buffer ")
    assert f"{path} (table 'buf'): database is locked" in str(info.value)
    other.rollback()
    other.close()
    store.add([exp(2, 0)], 2)  # the step is written once the lock is gone
    assert [e.eid for _, _, e in store.unconsumed()] == ["s1-0", "s2-0"]
    store.close()
