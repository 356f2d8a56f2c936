"""Task selectors: random, offline_easy2hard and diff_based orders derived by hand, the
explorer's feedback, exact resume from the saved selector state, and their errors."""

import json
import math
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.test_buffer_taskset import storage, write_jsonl
from trinity.buffer import MixedTaskReader, TaskReader
from trinity.buffer.file_reader import DataError
from trinity.buffer.selector import build_selector
from trinity.buffer.selector_state import SelectorStateFile
from trinity.common.config import ConfigError, load_config
from trinity.common.config.base import validate_model
from trinity.common.config.config import Config
from trinity.common.config.schema_buffer import StorageConfig, TaskSelectorConfig
from trinity.common.experience import Experience
from trinity.common.workflows.workflow import Task
from trinity.explorer.explorer import task_feedback
from trinity.explorer.runner import TaskResult
from trinity.preflight.before_start import check_before_start
from trinity.preflight.validate import buffer_component_problems
from trinity.runtime.explorer_role import resume_reader

# difficulty: a level (higher is harder); accuracy: a prior run's success rate per task
ROWS = [
    {"question": "0+1", "answer": "1", "level": 3, "accuracy": 0.25},
    {"question": "1+1", "answer": "2", "level": 1, "accuracy": 0.9},
    {"question": "2+1", "answer": "3", "level": 2, "accuracy": 0.5},
    {"question": "3+1", "answer": "4", "level": 1, "accuracy": 0.9},
    {"question": "4+1", "answer": "5", "level": 5, "accuracy": 0.0},
    {"question": "5+1", "answer": "6", "level": 4, "accuracy": 1.0},
]
GRPO_SMALL = Path(__file__).parent.parent / "integration" / "configs" / "grpo_small.yaml"


def selector_cfg(selector_type, **fields):
    return TaskSelectorConfig(selector_type=selector_type, **fields)


def reader(tmp_path, selector, rows=ROWS, **kwargs):
    write_jsonl(tmp_path / "train.jsonl", rows)
    return TaskReader(storage(tmp_path, task_selector=selector), **kwargs)


def indices(tasks):
    return [t.index for t in tasks]


# ---- random ------------------------------------------------------------------------------
def test_random_draws_each_batch_afresh_with_the_documented_seed(tmp_path):
    r = reader(tmp_path, selector_cfg("random", seed=5), total_epochs=2)
    batches = [indices(r.read(4)) for _ in range(3)]
    # rule: random.Random(seed + rows drawn before).sample(range(rows), n); 12 rows = 2 epochs
    expected = [random.Random(5 + drawn).sample(range(6), 4) for drawn in (0, 4, 8)]
    assert batches == expected
    assert all(len(set(b)) == 4 for b in batches)
    with pytest.raises(StopIteration):
        r.read(4)


def test_random_last_batch_is_short_at_the_end_of_the_epochs(tmp_path):
    r = reader(tmp_path, selector_cfg("random", seed=1), total_epochs=1)
    assert [len(r.read(4)) for _ in range(2)] == [4, 2]


# ---- offline_easy2hard ---------------------------------------------------------------------
def test_offline_easy2hard_serves_the_highest_accuracy_first_every_epoch(tmp_path):
    cfg = selector_cfg("offline_easy2hard", feature_keys=["accuracy"])
    r = reader(tmp_path, cfg, total_epochs=2)
    # accuracy 1.0 (row 5), 0.9 (rows 1, 3: file order), 0.5 (2), 0.25 (0), 0.0 (4)
    assert indices(r.read(6)) == [5, 1, 3, 2, 0, 4]
    assert indices(r.read(6)) == [5, 1, 3, 2, 0, 4]


def test_offline_easy2hard_ascending_on_a_difficulty_level(tmp_path):
    cfg = selector_cfg("offline_easy2hard", feature_keys=["level"], kwargs={"descending": False})
    # level 1 (rows 1, 3), 2 (row 2), 3 (row 0), 4 (row 5), 5 (row 4)
    assert indices(reader(tmp_path, cfg).read(6)) == [1, 3, 2, 0, 5, 4]


def test_offline_easy2hard_breaks_ties_with_the_next_key(tmp_path):
    cfg = selector_cfg(
        "offline_easy2hard", feature_keys=["level", "accuracy"], kwargs={"descending": False}
    )
    rows = [dict(ROWS[i], level=1) for i in range(4)]  # one level; accuracy decides
    # ascending accuracy: 0.25 (row 0), 0.5 (2), 0.9 (1, 3)
    assert indices(reader(tmp_path, cfg, rows).read(4)) == [0, 2, 1, 3]


# ---- diff_based ----------------------------------------------------------------------------
def test_diff_based_estimates_follow_the_documented_update():
    selector = build_selector(selector_cfg("diff_based", kwargs={"lamb": 0.2}))
    selector.bind(4, {})
    selector.feedback([0, 1, 2, 3], [1.0, 0.5, 0.0, 0.75], [8, 8, 8, 4])
    # (1 + s) / (2 + s + f): row 0 s=8 f=0; row 1 s=4 f=4; row 2 s=0 f=8; row 3 s=3 f=1
    assert [selector.estimate(i) for i in range(4)] == pytest.approx([0.9, 0.5, 0.1, 4 / 6])
    selector.feedback([1], [1.0], [8])
    # row 1: s = 0.8 * 4 + 8 = 11.2, f = 0.8 * 4 = 3.2 -> 12.2 / 16.4
    assert selector.estimate(1) == pytest.approx(12.2 / 16.4)
    selector.feedback([2], [1.7], [2])  # a reward above 1 counts as a success
    assert selector.successes_failures(2) == pytest.approx((2.0, 6.4))


def test_diff_based_greedy_takes_the_tasks_nearest_the_target(tmp_path):
    cfg = selector_cfg("diff_based", kwargs={"tau": 0.0})
    r = reader(tmp_path, cfg, total_steps=5)
    r.feedback({"math": ([0, 1, 2, 3], [1.0, 0.5, 0.0, 0.75], [8, 8, 8, 4])})
    # estimates 0.9, 0.5, 0.1, 0.667 and 0.5 for rows 4, 5 (no feedback): distance to 0.5
    # is 0 for rows 1, 4, 5 (lowest index first), 0.167 for row 3, then 0.4 for rows 0, 2
    assert indices(r.read(4)) == [1, 4, 5, 3]
    r.feedback({"math": ([1, 4, 5], [1.0, 1.0, 0.0], [8, 8, 8])})
    # row 1: s = 0.8 * 4 + 8 = 11.2, f = 0.8 * 4 = 3.2 -> 12.2 / 16.4 = 0.744; rows 4, 5 ->
    # 0.9, 0.1. Nearest 0.5 now: row 3 (0.167 away), row 1 (0.244); rows 0, 2, 4, 5: 0.4
    assert indices(r.read(2)) == [3, 1]


def test_diff_based_target_and_prior_column(tmp_path):
    cfg = selector_cfg(
        "diff_based",
        feature_keys=["accuracy"],
        kwargs={"tau": 0.0, "target_reward": 0.25, "prior_rollouts": 8},
    )
    r = reader(tmp_path, cfg, total_steps=2)
    # prior: s = 8q, f = 8(1 - q) -> (1 + 8q) / 10: rows 0.3, 0.82, 0.5, 0.82, 0.1, 0.9
    assert [r.cursor.selector.estimate(i) for i in range(6)] == pytest.approx(
        [0.3, 0.82, 0.5, 0.82, 0.1, 0.9]
    )
    assert indices(r.read(3)) == [0, 4, 2]  # 0.05, 0.15 and 0.25 away from 0.25


def test_diff_based_sampling_follows_the_softmax_of_the_scores():
    tau = 0.2
    selector = build_selector(selector_cfg("diff_based", seed=0, kwargs={"tau": tau}))
    selector.bind(3, {})
    selector.feedback([0, 1, 2], [0.5, 1.0, 0.0], [8, 8, 8])  # estimates 0.5, 0.9, 0.1
    weights = [math.exp(-abs(0.5 - p) / tau) for p in (0.5, 0.9, 0.1)]
    draws = [selector.pick(3, 1, drawn)[0] for drawn in range(4000)]
    first = draws.count(0) / len(draws)
    assert first == pytest.approx(weights[0] / sum(weights), abs=0.03)  # 1 / (1 + 2 e^-2) = 0.787
    assert draws.count(1) == pytest.approx(draws.count(2), rel=0.25)  # equally far
    assert len(set(selector.pick(3, 3, 7))) == 3  # a batch holds distinct rows


def test_diff_based_do_sample_scores_a_seeded_beta_draw():
    cfg = selector_cfg("diff_based", seed=3, kwargs={"tau": 0.0, "do_sample": True})
    selector = build_selector(cfg)
    selector.bind(3, {})
    selector.feedback([0, 1, 2], [0.5, 1.0, 0.0], [2, 2, 2])
    rng = random.Random(3 + 10)
    draws = [rng.betavariate(1 + s, 1 + f) for s, f in ((1, 1), (2, 0), (0, 2))]
    expected = min(range(3), key=lambda i: (abs(0.5 - draws[i]), i))
    assert selector.pick(3, 1, 10) == [expected]


# ---- feedback from the explorer ------------------------------------------------------------
def result(taskset, index, rewards, n, **kwargs):
    task = Task(taskset_name=taskset, index=index)
    task.rollout_args = SimpleNamespace(n=n)
    exps = [Experience(tokens=[1, 2], prompt_length=1, reward=r) for r in rewards]
    return TaskResult(task, exps, **kwargs)


def test_task_feedback_is_the_mean_reward_per_task_over_its_finished_pieces():
    results = [
        result("a", 3, [1.0, 0.0], 2),
        result("a", 3, [1.0, 1.0], 2),  # the second piece of a split task
        result("b", 0, [0.5], 1),
        result("a", 4, [], 2, error="boom"),  # failed: says nothing about the task
        result("a", 5, [1.0], 1, left_behind=True),
        result("a", 6, [None], 1),  # no reward
    ]
    assert task_feedback(results) == {"a": ([3], [0.75], [4]), "b": ([0], [0.5], [1])}


def test_mixed_reader_keeps_round_robin_and_routes_feedback(tmp_path):
    write_jsonl(tmp_path / "a" / "train.jsonl", ROWS[:2])
    write_jsonl(tmp_path / "b" / "train.jsonl", ROWS)
    a = TaskReader(storage(tmp_path / "a", name="a"))
    cfg = selector_cfg("diff_based", kwargs={"tau": 0.0})
    b = TaskReader(storage(tmp_path / "b", name="b", task_selector=cfg))
    mixed = MixedTaskReader([a, b])
    first = mixed.read(3)  # a0, b, a1 in turns; b's first pick is row 0 (all at 0.5)
    assert [(t.taskset_name, t.index) for t in first] == [("a", 0), ("b", 0), ("a", 1)]
    mixed.feedback({"b": ([1, 2], [1.0, 0.0], [8, 8]), "a": ([0], [1.0], [8])})
    # a is used up; b gives 4 distinct rows: 3, 4, 5 at 0.5 (and row 0), not 1 or 2
    assert [(t.taskset_name, t.index) for t in mixed.read(4)] == [("b", i) for i in (0, 3, 4, 5)]
    assert mixed.learns and not a.learns


# ---- exact resume --------------------------------------------------------------------------
def explore(r, steps, batch=2):
    """Read ``steps`` batches, feeding back a reward derived from each row index."""
    out = []
    for _ in range(steps):
        rows = indices(r.read(batch))
        out.append(rows)
        r.feedback({"math": (rows, [(i % 3) / 2 for i in rows], [4] * len(rows))})
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        selector_cfg("diff_based", seed=9, feature_keys=["accuracy"]),
        selector_cfg("diff_based", kwargs={"tau": 0.0, "do_sample": True}),
        selector_cfg("random", seed=2),
        selector_cfg("offline_easy2hard", feature_keys=["level"]),
    ],
)
def test_saved_state_resumes_the_same_next_batches(tmp_path, cfg):
    whole = explore(reader(tmp_path, cfg, total_epochs=3), 8)
    first = reader(tmp_path, cfg, total_epochs=3)
    got = explore(first, 5)
    states = SelectorStateFile(str(tmp_path / "job" / "buffer" / "selector_state.json"))
    states.save(5, json.loads(json.dumps(first.learned_state())))  # what the file holds
    resumed = reader(tmp_path, cfg, total_epochs=3)
    resume_reader(resumed, states, 5, batch_size=2)
    got += explore(resumed, 3)
    assert got == whole


def test_a_reader_ahead_of_the_written_step_resumes_from_that_step(tmp_path):
    """fully_async reads steps before the earlier ones are written: the position comes from
    reading the written steps' batches again, the learned state from the written steps."""
    cfg = selector_cfg("diff_based", seed=4, kwargs={"tau": 0.0})
    ahead = reader(tmp_path, cfg, total_epochs=3)
    batches = [indices(ahead.read(2)) for _ in range(4)]  # steps 1-4 in flight
    for rows in batches[:3]:  # steps 1-3 finish and are written; step 4 is lost in a kill
        ahead.feedback({"math": (rows, [1.0] * len(rows), [4] * len(rows))})
    states = SelectorStateFile(str(tmp_path / "selector_state.json"))
    states.save(3, ahead.learned_state())
    resumed = reader(tmp_path, cfg, total_epochs=3)
    resume_reader(resumed, states, 3, batch_size=2)
    assert resumed.state_dict()["steps"] == 3  # step 4 is read again, not skipped
    assert resumed.learned_state() == ahead.learned_state()
    fed = set(sum(batches[:3], []))
    # every row fed back scores 0.9 now (s = 4 per feedback): step 4 takes unexplored rows
    assert not fed & set(indices(resumed.read(2)))


def test_state_file_keeps_the_last_two_steps(tmp_path):
    states = SelectorStateFile(str(tmp_path / "state.json"))
    for step in (1, 2, 3):
        states.save(step, {"steps": step})
    assert [states.load(s) for s in (1, 2, 3)] == [None, {"steps": 2}, {"steps": 3}]
    states.save(3, {"steps": 30})  # step 3 explored again after a kill before its write
    assert states.load(2) == {"steps": 2} and states.load(3) == {"steps": 30}
    assert not os.path.exists(f"{states.path}.tmp")


def test_without_saved_state_a_static_order_is_replayed(tmp_path):
    cfg = selector_cfg("shuffle", seed=4)
    full = reader(tmp_path, cfg, total_epochs=2)
    whole = [indices(full.read(4)) for _ in range(3)]
    resumed = reader(tmp_path, cfg, total_epochs=2)
    resume_reader(resumed, SelectorStateFile(str(tmp_path / "none.json")), 2, batch_size=4)
    assert indices(resumed.read(4)) == whole[2]


# ---- errors --------------------------------------------------------------------------------
def test_a_missing_feature_column_names_the_file_and_the_key(tmp_path):
    cfg = selector_cfg("offline_easy2hard", feature_keys=["difficulty"])
    with pytest.raises(DataError) as info:
        reader(tmp_path, cfg)
    message = str(info.value)
    assert f"path '{tmp_path}'" in message
    assert "column(s) ['difficulty'] named in `task_selector.feature_keys` are missing" in message


def test_bad_feature_values_name_the_line(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[2]["level"] = "hard"
    cfg = selector_cfg("offline_easy2hard", feature_keys=["level"])
    with pytest.raises(DataError, match=r"line 3: 'level' is a string, expected a finite number"):
        reader(tmp_path, cfg, rows)
    rows[2]["accuracy"] = 1.5
    cfg = selector_cfg("diff_based", feature_keys=["accuracy"])
    with pytest.raises(DataError, match=r"line 3: 'accuracy' is 1.5, expected a success rate"):
        reader(tmp_path, cfg, rows)


def config_problems(**task_selector):
    taskset = {"name": "a", "path": "/data", "task_selector": task_selector}
    config = validate_model(Config, {"buffer": {"explorer_input": {"taskset": taskset}}})
    return buffer_component_problems(config)


def test_selector_arguments_are_checked_before_start():
    key = "buffer.explorer_input.tasksets[0].task_selector"
    (typo,) = config_problems(selector_type="diff_based", kwargs={"targt_reward": 0.4})
    assert typo.startswith(f"{key}.kwargs.targt_reward: selector 'diff_based' has no argument")
    assert "did you mean 'target_reward'?" in typo
    (bound,) = config_problems(selector_type="diff_based", kwargs={"tau": -1})
    assert bound == f"{key}: kwargs.tau = -1 must be in [0.0, inf]"
    (empty,) = config_problems(selector_type="offline_easy2hard")
    assert empty.startswith(f"{key}: offline_easy2hard orders rows by task_selector.feature_keys")
    (two,) = config_problems(selector_type="diff_based", feature_keys=["a", "b"])
    assert "not supported yet" in two
    assert config_problems(selector_type="difficulty_based", kwargs={"tau": 0.5}) == []


def test_a_missing_feature_column_fails_before_start(tmp_path, micro_model, arithmetic_data):
    overrides = [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"buffer.explorer_input.taskset.path={arithmetic_data['rl']}",
        f"buffer.explorer_input.eval_tasksets.0.path={arithmetic_data['rl']}",
        "buffer.explorer_input.taskset.task_selector="
        "{selector_type: offline_easy2hard, feature_keys: [difficulty]}",
    ]
    with pytest.raises(ConfigError) as info:
        check_before_start(load_config(str(GRPO_SMALL), overrides))
    (problem,) = info.value.problems
    assert problem.startswith(
        f"buffer.explorer_input.tasksets[0] (path '{arithmetic_data['rl']}') (split 'train'): "
        "column(s) ['difficulty'] named in `task_selector.feature_keys` are missing"
    )


def test_data_selector_is_an_alias_of_task_selector():
    aliased = StorageConfig(name="a", data_selector={"selector_type": "random", "seed": 3})
    assert aliased.task_selector == TaskSelectorConfig(selector_type="random", seed=3)
    assert "data_selector" not in aliased.model_dump()
    with pytest.raises(ValueError, match="either `task_selector` or its alias `data_selector`"):
        StorageConfig(name="a", data_selector={}, task_selector={})
