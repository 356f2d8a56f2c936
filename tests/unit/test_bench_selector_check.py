"""bench/selector_check.py's arithmetic: time to target from the explorer records, and a
prior run's per-task mean reward read back from its experience table."""

import sqlite3

from bench import selector_check


def test_time_to_target_is_the_first_eval_at_or_above_it():
    key = selector_check.HELDOUT
    records = [
        {"step": 0, "time": 100.0, key: 0.5},
        {"step": 1, "time": 101.0, "rollout/reward/mean": 0.9},  # not an eval
        {"step": 2, "time": 103.5, key: 0.69},
        {"step": 4, "time": 106.0, key: 0.7},
        {"step": 6, "time": 108.0, key: 0.65},
    ]
    result = selector_check.time_to_target(records, target=0.7)
    assert result["heldout_accuracy"] == [(0, 0.5), (2, 0.69), (4, 0.7), (6, 0.65)]
    assert (result["steps_to_target"], result["seconds_to_target"]) == (4, 6.0)
    never = selector_check.time_to_target(records, target=0.8)
    assert (never["steps_to_target"], never["seconds_to_target"]) == (None, None)


def test_task_rewards_average_each_row_and_clip_to_one(tmp_path):
    database = str(tmp_path / "buffer.db")
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE arithmetic_buffer (group_id TEXT, reward REAL)")
        rows = [
            ("train-1-arithmetic_train-7", 1.0),
            ("train-1-arithmetic_train-7", 0.0),
            ("train-2-arithmetic_train-7", 2.0),  # counts as 1
            ("train-2-arithmetic_train-12", None),  # no reward: 0
        ]
        conn.executemany("INSERT INTO arithmetic_buffer VALUES (?, ?)", rows)
    assert selector_check.task_rewards(database) == {7: 2 / 3, 12: 0.0}
