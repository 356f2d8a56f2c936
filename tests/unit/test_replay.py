"""Replay buffer: priority arithmetic, and which consumed experiences a read reuses."""

import random

import pytest

from trinity.buffer import ExperienceQueue, SQLExperienceStore
from trinity.buffer.priority import PRIORITY_FN, build_priority_fn
from trinity.buffer.replay import ReplayPool
from trinity.common.config import Config
from trinity.common.config.base import validate_model
from trinity.common.experience import Experience
from trinity.preflight.validate import buffer_component_problems


# ---- priority functions ------------------------------------------------------------------
def test_linear_decay_is_version_minus_decay_times_uses():
    fn = build_priority_fn("linear_decay", {})
    assert fn.priority(model_version=5, use_count=1) == 3.0  # 5 - 2.0 * 1
    assert fn.priority(model_version=5, use_count=2) == 1.0  # 5 - 2.0 * 2
    half = build_priority_fn("linear_decay", {"decay": 0.5})
    assert half.priority(model_version=3, use_count=4) == 1.0  # 3 - 0.5 * 4
    assert fn.reusable(1) and fn.reusable(1000)  # never retired


def test_use_count_control_retires_at_the_limit():
    fn = build_priority_fn(
        "linear_decay_use_count_control_randomization", {"decay": 1.2, "use_count_limit": 2}
    )
    assert fn.priority(model_version=3, use_count=1) == pytest.approx(1.8)  # 3 - 1.2
    assert fn.priority(model_version=0, use_count=2) == pytest.approx(-2.4)
    assert fn.reusable(1) and not fn.reusable(2)  # trained on at most twice
    defaults = build_priority_fn("linear_decay_use_count_control_randomization", {})
    assert (defaults.decay, defaults.use_count_limit, defaults.sigma) == (2.0, 3, 0.0)
    unlimited = build_priority_fn(
        "linear_decay_use_count_control_randomization", {"use_count_limit": 0}
    )
    assert unlimited.reusable(10**6)


def test_randomization_adds_gaussian_noise_of_sigma():
    fn = build_priority_fn(
        "linear_decay_use_count_control_randomization", {"sigma": 0.5, "seed": 7}
    )
    expected = random.Random(7)
    for _ in range(3):
        assert fn.priority(4, 1) == 4 - 2.0 + expected.gauss(0.0, 0.5)
    draws = [fn.priority(4, 1) - 2.0 for _ in range(4000)]
    mean = sum(draws) / len(draws)
    std = (sum((d - mean) ** 2 for d in draws) / len(draws)) ** 0.5
    assert abs(mean) < 0.05 and abs(std - 0.5) < 0.05


def test_bad_priority_arguments_are_config_errors():
    assert PRIORITY_FN.names() == [
        "decay_limit_randomization",
        "linear_decay",
        "linear_decay_use_count_control_randomization",
    ]
    # linear_decay takes decay only
    assert "sigma" in replay_problem(priority_fn="linear_decay", priority_fn_args={"sigma": 1.0})
    assert "sigma must be >= 0" in replay_problem(
        priority_fn="linear_decay_use_count_control_randomization",
        priority_fn_args={"sigma": -1.0},
    )
    assert "did you mean 'linear_decay'" in replay_problem(priority_fn="linear_decy")


def replay_problem(**replay) -> str:
    """The one problem the config checks find in an experience buffer's ``replay_buffer``."""
    storage = {"name": "e", "storage_type": "queue", "replay_buffer": replay}
    config = validate_model(Config, {"buffer": {"trainer_input": {"experience_buffer": storage}}})
    (problem,) = buffer_component_problems(config)
    assert problem.startswith("buffer.trainer_input.experience_buffer.replay_buffer: priority_fn")
    return problem


# ---- selection -----------------------------------------------------------------------------
def exp(i: int, version: int = 0, group: str = "") -> Experience:
    return Experience(
        tokens=[1, 2, 3 + i], prompt_length=2, eid=f"e{i}", model_version=version, group_id=group
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_queue(cooldown, fn="linear_decay", args=None, store=None, rewind_to=None):
    """A queue whose replay pool reads a clock the test moves."""
    queue = ExperienceQueue(store=store, rewind_to=rewind_to)
    clock = Clock()
    queue.replay = ReplayPool(cooldown, fn, args, store, rewind_to, clock=clock)
    return queue, clock


def read(queue, n, step, whole_groups=False):
    """Train step ``step``'s read: (eid, use_count) pairs."""
    got = queue.get(n, max_step=step, consumer=step, whole_groups=whole_groups).experiences
    return [(e.eid, e.info["use_count"]) for e in got]


def test_fresh_first_then_replays_once_the_cooldown_passed():
    q, clock = replay_queue(cooldown=10)
    q.put([exp(i) for i in range(4)], step=1)
    assert read(q, 4, 1) == [("e0", 1), ("e1", 1), ("e2", 1), ("e3", 1)]
    clock.now = 5  # step 1's rows cool down until t=10: a short step stays short, no waiting
    q.put([exp(4, version=1), exp(5, version=1)], step=2)
    assert read(q, 4, 2) == [("e4", 1), ("e5", 1)]
    clock.now = 12  # step 1's rows are ready (priority 0 - 2*1), step 2's not until t=15
    q.put([exp(6, version=2)], step=3)
    assert read(q, 4, 3) == [("e6", 1), ("e0", 2), ("e1", 2), ("e2", 2)]
    assert q.size() == 0  # fresh rows were read once; replays are not queue items


def test_replays_by_priority_and_use_counts_grow():
    # decay 1: priority = model_version - use_count
    q, clock = replay_queue(cooldown=1, args={"decay": 1.0})
    q.put([exp(0, version=0)], step=1)
    q.put([exp(1, version=3)], step=2)
    q.put([exp(2, version=1)], step=3)
    assert read(q, 3, 3) == [("e0", 1), ("e1", 1), ("e2", 1)]
    q.put([], step=4)
    clock.now = 2  # priorities: e0 -1, e1 2, e2 0
    assert read(q, 2, 4) == [("e1", 2), ("e2", 2)]
    q.put([], step=5)
    clock.now = 4  # e0 -1 (used once), e1 3-2 = 1, e2 1-2 = -1: e1, then the tie by last use
    assert read(q, 2, 5) == [("e1", 3), ("e0", 2)]
    q.put([], step=6)
    clock.now = 6  # e0 -2, e1 0, e2 -1
    assert read(q, 3, 6) == [("e1", 4), ("e2", 3), ("e0", 3)]


def test_cooldown_respected_and_limit_retires():
    args = {"decay": 2.0, "use_count_limit": 2}
    q, clock = replay_queue(4, "linear_decay_use_count_control_randomization", args)
    q.put([exp(0)], step=1)
    assert read(q, 2, 1) == [("e0", 1)]
    q.put([], step=2)
    clock.now = 3.9
    assert read(q, 2, 2) == []  # not cooled down: the step trains on nothing, no wait
    q.put([], step=3)
    clock.now = 4.0
    assert read(q, 2, 3) == [("e0", 2)]
    q.put([], step=4)
    clock.now = 100
    assert read(q, 2, 4) == []  # used use_count_limit = 2 times: retired
    assert q.replay.size() == 0


def test_no_cooldown_means_never_reused():
    q, clock = replay_queue(cooldown=None)
    q.put([exp(0)], step=1)
    assert read(q, 2, 1) == [("e0", 1)]
    q.put([], step=2)
    clock.now = 10**6
    assert read(q, 2, 2) == [] and q.replay.size() == 0


def test_whole_groups_are_replayed_whole():
    q, clock = replay_queue(cooldown=0)
    q.put([exp(0, 1, "a"), exp(1, 1, "a"), exp(2, 0, "b"), exp(3, 0, "b"), exp(4, 0, "b")], 1)
    assert len(read(q, 5, 1, whole_groups=True)) == 5
    q.put([exp(5, 2, "c")], step=2)
    clock.now = 1
    # room for 3: group a (priority 1 - 2 = -1) fits; group b (-2, three rows) does not
    assert read(q, 4, 2, whole_groups=True) == [("e5", 1), ("e0", 2), ("e1", 2)]
    q.put([], step=3)
    clock.now = 2  # a: 1 - 4 = -3, b: -2, c: 2 - 2 = 0 -> c, then b (3 rows) fills the 4
    assert read(q, 4, 3, whole_groups=True) == [("e5", 2), ("e2", 2), ("e3", 2), ("e4", 2)]


def test_timeout_and_end_are_not_padded():
    q, clock = replay_queue(cooldown=0)
    q.put([exp(0)], step=1)
    read(q, 1, 1)
    clock.now = 1
    late = q.get(2, max_step=2, timeout=0.05, consumer=2)
    assert late.state == "timeout" and late.experiences == []  # the explorer is late
    q.close()
    ended = q.get(2, max_step=2, consumer=2)
    assert ended.state == "ended" and ended.experiences == []  # the trainer stops


# ---- persistence ---------------------------------------------------------------------------
def consumed_by(store) -> dict:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(store.table.c.eid, store.table.c.consumed_by))
        return dict(rows.all())


def test_use_counts_survive_a_restart_and_rewind(database):
    location = database  # a SQLite file, then a PostgreSQL database
    q, clock = replay_queue(cooldown=1, store=SQLExperienceStore(location))
    q.put([exp(0), exp(1)], step=1)
    assert read(q, 2, 1) == [("e0", 1), ("e1", 1)]
    for step in (2, 3):
        q.put([exp(step)], step=step)
        clock.now += 2
        assert len(read(q, 2, step)) == 2  # one fresh row, one replay from the store
    # each fresh row was consumed once, by the step that read it fresh
    assert consumed_by(q.store) == {"e0": 1, "e1": 1, "e2": 2, "e3": 3}
    counts = {row[0]: row[4] for row in q.store.replay_candidates()}
    assert counts == {1: 2, 2: 2, 3: 1, 4: 1}  # e0, e1 replayed once each
    q.store.close()

    # resumed from the checkpoint of train step 2: step 3's read is undone
    store = SQLExperienceStore(location)
    resumed, clock = replay_queue(cooldown=1, store=store, rewind_to=2)
    counts = {row[0]: row[4] for row in store.replay_candidates()}
    assert counts == {1: 2, 2: 1, 3: 1}  # step 3's uses forgotten, e3 (id 4) fresh again
    clock.now = 10**10
    # fresh e3, then by priority (0 - 2 * uses): e1 and e2 (used once) before e0 (twice)
    assert read(resumed, 3, 3) == [("e3", 1), ("e1", 2), ("e2", 2)]
    store.close()


# ---- configuration -------------------------------------------------------------------------
REPLAY_YAML = """
mode: {mode}
model: {{model_path: /models/tiny, max_prompt_tokens: 16, max_response_tokens: 8}}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{name: t, storage_type: file, path: /data/t}}
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      replay_buffer: {{enable: true, reuse_cooldown_time: {cooldown}}}
"""


def finalized(tmp_path, mode="both", cooldown="null"):
    from trinity.common.config import load_config
    from trinity.preflight.derive import finalize

    path = tmp_path / "replay.yaml"
    path.write_text(REPLAY_YAML.format(mode=mode, cooldown=cooldown))
    return finalize(load_config(str(path), []))


def test_replay_config_scope_and_idle_warning(tmp_path, caplog):
    from trinity.common.config import ConfigError

    with caplog.at_level("WARNING", logger="trinity.config"):
        finalized(tmp_path, cooldown="null")
    assert "replay_buffer.enable = true: reuse_cooldown_time is null" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="trinity.config"):
        finalized(tmp_path, cooldown="30")
    assert "replay_buffer" not in caplog.text
    with pytest.raises(ConfigError, match="replay_buffer.enable = true is not supported yet"):
        finalized(tmp_path, mode="explore", cooldown="30")
    with pytest.raises(ConfigError, match="reuse_cooldown_time = -1 must be >= 0"):
        finalized(tmp_path, cooldown="-1")


def test_the_originals_later_name_is_the_same_function():
    # decay 2, used once: 5 - 2 * 1 = 3; retired at its third use
    fn = build_priority_fn("decay_limit_randomization", {"decay": 2.0, "use_count_limit": 3})
    assert fn.priority(5, 1) == 3.0
    assert fn.reusable(2) and not fn.reusable(3)
