"""ExperienceQueue: FIFO order, timeouts, close, SQLite persistence, threads."""

import threading
import time

import pytest
import torch

from trinity.buffer import (
    ExperienceQueue,
    SQLiteExperienceStore,
    deserialize_experience,
    serialize_experience,
)
from trinity.common.experience import Experience


def exp(i: int, source: str = "p") -> Experience:
    return Experience(tokens=[1, 2, 3 + i], prompt_length=2, reward=float(i), eid=f"{source}-{i}")


def eids(exps) -> list:
    return [e.eid for e in exps]


def test_fifo_order_across_puts():
    q = ExperienceQueue()
    q.put([exp(0), exp(1)])
    q.put([exp(2)])
    assert q.size() == 3
    assert eids(q.get(2)) == ["p-0", "p-1"]
    assert eids(q.get(1)) == ["p-2"]


def test_get_returns_partial_batch_after_timeout():
    q = ExperienceQueue()
    q.put([exp(0), exp(1)])
    start = time.monotonic()
    got = q.get(5, timeout=0.2)
    assert eids(got) == ["p-0", "p-1"]
    assert time.monotonic() - start >= 0.2
    assert q.get(1, timeout=0.05) == []  # nothing arrived: an empty batch, not an error


def test_get_wakes_when_enough_arrive():
    q = ExperienceQueue()
    threading.Timer(0.05, lambda: q.put([exp(0), exp(1), exp(2)])).start()
    assert eids(q.get(3, timeout=5)) == ["p-0", "p-1", "p-2"]


def test_close_releases_waiting_reader_then_stops():
    q = ExperienceQueue()
    q.put([exp(0)])
    threading.Timer(0.05, q.close).start()
    assert eids(q.get(4)) == ["p-0"]  # no timeout: close is what ends the wait
    with pytest.raises(StopIteration):
        q.get(1)
    with pytest.raises(RuntimeError, match="closed"):
        q.put([exp(1)])


def test_capacity_blocks_writer_until_read():
    q = ExperienceQueue(capacity=2)
    q.put([exp(0), exp(1)])
    with pytest.raises(TimeoutError):
        q.put([exp(2)], timeout=0.05)
    threading.Timer(0.05, lambda: q.get(1)).start()
    q.put([exp(2)], timeout=5)
    assert eids(q.get(2)) == ["p-1", "p-2"]


@pytest.mark.parametrize("url", [True, False], ids=["sqlite-url", "plain-path"])
def test_persistence_reloads_only_unconsumed_in_order(tmp_path, url):
    path = tmp_path / "sub" / "buffer.db"
    location = f"sqlite:///{path}" if url else str(path)
    q = ExperienceQueue(store=SQLiteExperienceStore(location))
    q.put([exp(i) for i in range(5)])
    assert eids(q.get(2)) == ["p-0", "p-1"]
    q.store.close()  # the process "crashes" here

    restarted = ExperienceQueue(store=SQLiteExperienceStore(location))
    assert restarted.size() == 3
    restarted.put([exp(5)])
    got = restarted.get(4)
    assert eids(got) == ["p-2", "p-3", "p-4", "p-5"]
    assert [e.reward for e in got] == [2.0, 3.0, 4.0, 5.0]
    assert torch.equal(got[0].tokens, torch.tensor([1, 2, 5]))
    restarted.store.close()

    assert ExperienceQueue(store=SQLiteExperienceStore(location)).size() == 0  # none replayed


def test_json_backup_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not supported yet"):
        SQLiteExperienceStore(str(tmp_path / "buffer.json"))


def test_serialization_is_exact():
    big = torch.arange(1000)
    original = Experience(
        tokens=big[10:16],  # a view: only its 6 values may be stored
        prompt_length=2,
        reward=0.25,
        logprobs=torch.randn(4),
        action_mask=[1, 0, 1, 1],
        advantages=torch.randn(4, dtype=torch.float64),
        returns=torch.randn(4),
        info={"answer": "42", "turns": [1, 2]},
        metrics={"len": 4.0},
        group_id="g1",
        model_version=7,
        prompt_text="q",
        response_text="a",
    )
    data = serialize_experience(original)
    assert len(data) < 4000  # the 1000-element base tensor (8 KB) was not written
    copy = deserialize_experience(data)
    for name in ("tokens", "logprobs", "action_mask", "advantages", "returns"):
        a, b = getattr(original, name), getattr(copy, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    for name in ("prompt_length", "reward", "info", "metrics", "group_id", "eid", "model_version"):
        assert getattr(copy, name) == getattr(original, name), name


def test_concurrent_producers_and_consumer(tmp_path):
    store = SQLiteExperienceStore(str(tmp_path / "q.db"))
    q = ExperienceQueue(capacity=16, store=store)
    received = []

    def produce(source: str):
        for start in range(0, 40, 5):  # 8 puts of 5 experiences each
            q.put([exp(i, source) for i in range(start, start + 5)])

    def consume():
        while True:
            try:
                received.extend(q.get(7, timeout=1))
            except StopIteration:
                return

    producers = [threading.Thread(target=produce, args=(s,)) for s in ("a", "b", "c")]
    consumer = threading.Thread(target=consume)
    consumer.start()
    for p in producers:
        p.start()
    for p in producers:
        p.join(timeout=20)
    q.close()
    consumer.join(timeout=20)
    assert len(received) == 120 and len(set(eids(received))) == 120
    for s in ("a", "b", "c"):  # each producer's items arrive in the order it put them
        assert [e.eid for e in received if e.eid.startswith(s)] == [f"{s}-{i}" for i in range(40)]
    assert ExperienceQueue(store=SQLiteExperienceStore(str(tmp_path / "q.db"))).size() == 0


def test_rows_written_with_torch_save_still_load():
    """Stores written before experiences were pickled hold torch.save archives."""
    import dataclasses
    import io

    original = Experience(tokens=[1, 2, 3, 4], prompt_length=2, reward=1.0, logprobs=[-0.5, -1])
    buffer = io.BytesIO()
    torch.save({f.name: getattr(original, f.name) for f in dataclasses.fields(original)}, buffer)
    copy = deserialize_experience(buffer.getvalue())
    assert torch.equal(copy.tokens, original.tokens) and copy.eid == original.eid
    assert torch.equal(copy.logprobs, original.logprobs) and copy.reward == 1.0
