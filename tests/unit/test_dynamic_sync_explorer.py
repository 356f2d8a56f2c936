"""The plain ``Explorer`` under each ``sync_style`` (what it asks the synchronizer for, step by
step), over_rollout's left-behind tasks, and the config checks of the dynamic-sync keys."""

from tests.unit.test_config_finalize import fake_algorithms, finalized, problems  # noqa: F401
from trinity.common.sync_schedule import Wanted
from trinity.common.workflows.workflow import Task
from trinity.explorer.explorer import Explorer
from trinity.explorer.runner import TaskResult


class Reader:
    def __init__(self, is_eval=False):
        self.is_eval = is_eval

    def read(self, n):
        return [Task(taskset_name="train", index=i) for i in range(n)]

    def read_all(self):
        return [Task(taskset_name="test", index=0, is_eval=True)]

    def feedback(self, rewards):
        pass


class Pool:
    """Records each call; with ``enough``, the tasks after the first ``enough`` are left behind."""

    def __init__(self):
        self.calls = []

    def run(self, tasks, label="", enough=None, wait_after_min=0.0):
        self.calls.append((label, len(tasks), enough, wait_after_min))
        kept = len(tasks) if enough is None else enough
        return [TaskResult(task=t) for t in tasks[:kept]] + [
            TaskResult(task=t, left_behind=True) for t in tasks[kept:]
        ]


def explore(tmp_path, *overrides):
    """Run a whole plain Explorer; returns (what it asked sync for, by step label), pool,
    logged metrics by step."""
    config = finalized(tmp_path, overrides=["buffer.total_steps=5", *overrides])
    asked, logged, pool = [], {}, Pool()

    def sync(want):
        asked.append((explorer.step, want))
        return 0

    def log(metrics, step):
        logged.setdefault(step, []).append(metrics)

    explorer = Explorer(config, pool, Reader(), {"test": Reader(True)}, sync, None, log)
    assert explorer.run() == 5
    return asked, pool, logged


def test_fixed_waits_for_versions_and_evaluates_the_last_step_once(tmp_path):
    asked, _, _ = explore(tmp_path, "synchronizer.sync_interval=2", "explorer.eval_interval=5")
    assert asked == [(s, Wanted(v)) for s, v in [(1, 0), (2, 0), (3, 2), (4, 2), (5, 4), (5, 5)]]


def test_fixed_evaluates_the_newest_published_weights_between_syncs(tmp_path):
    """Sync every 2 steps, evaluate every 3 of 5: at step 3 the trainer has published
    version 2 and publishes 4 only after explore step 4, which waits for this evaluation:
    the evaluation takes version 2. The last step's evaluation takes the final weights."""
    asked, pool, _ = explore(tmp_path, "synchronizer.sync_interval=2", "explorer.eval_interval=3")
    assert asked == [
        (s, Wanted(v)) for s, v in [(1, 0), (2, 0), (3, 2), (3, 2), (4, 2), (5, 4), (5, 5)]
    ]
    evals = [label for label, *_ in pool.calls if "eval" in label]
    assert evals == ["eval of test at step 0", "eval of test at step 3", "eval of test at step 5"]


def test_explorer_driven_asks_every_interval_and_its_last_eval_waits_for_the_end(tmp_path):
    asked, pool, logged = explore(
        tmp_path,
        "synchronizer.sync_style=explorer_driven",
        "synchronizer.sync_interval=2",
        "explorer.eval_interval=5",
    )
    # asks before steps 3 and 5; the default staleness bound (sync_interval + 1 = 3) makes
    # step 5 wait for version 1 (train step 5 would drop older samples); the evaluation after
    # the last step is the trainer's final weights (not the newest at step 5, then the final)
    assert asked == [
        (1, Wanted(0)),
        (2, Wanted(0)),
        (3, Wanted(0, ask=True)),
        (4, Wanted(0)),
        (5, Wanted(1, ask=True)),
        (5, Wanted(None, final=True)),
    ]
    evals = [label for label, *_ in pool.calls if "eval" in label]
    assert evals == ["eval of test at step 0", "eval of test at step 5"]
    assert len(logged[5]) == 1  # the rollout metrics; no eval row (empty fake results)


def test_trainer_driven_evaluates_the_newest_weights_between_steps(tmp_path):
    asked, _, _ = explore(
        tmp_path, "synchronizer.sync_style=trainer_driven", "explorer.eval_interval=2"
    )
    steps = [(s, w) for s, w in asked]
    # the evaluations at 2 and 4 take the newest (no wait); step s waits for version
    # s - 1 - 2 (the default staleness bound, sync_interval + 1), then the final weights
    floors = {1: 0, 2: 0, 3: 0, 4: 1, 5: 2}
    explore_steps = [(s, Wanted(floors[s])) for s in (1, 2, 3, 4, 5)]
    evals = [(2, Wanted(0)), (4, Wanted(0))]
    assert steps == [*explore_steps[:2], evals[0], *explore_steps[2:4], evals[1]] + [
        explore_steps[4],
        (5, Wanted(None, final=True)),
    ]


def test_over_rollout_passes_its_minimum_and_counts_what_was_left_behind(tmp_path):
    _, pool, logged = explore(
        tmp_path,
        "synchronizer.sync_style=trainer_driven",
        "explorer.over_rollout.ratio=0.5",
        "explorer.over_rollout.wait_after_min=2",
        "explorer.eval_interval=100",
    )
    train = [call for call in pool.calls if call[0].startswith("explore step")]
    # batch_size 4: wait for ceil(0.5 * 4) = 2 tasks, then 2 s more; evals wait for all
    assert train == [(f"explore step {s}", 4, 2, 2.0) for s in range(1, 6)]
    assert all(enough is None for label, _, enough, _ in pool.calls if "eval" in label)
    for step in range(1, 6):
        (metrics,) = logged[step]
        assert metrics["rollout/tasks_left_behind"] == 2 and metrics["rollout/tasks_failed"] == 0


def test_dynamic_styles_are_ignored_outside_mode_both_and_over_rollout_needs_them(tmp_path):
    # mode explore syncs nothing within the run: the style written for mode both is ignored
    config = finalized(
        tmp_path,
        overrides=[
            "mode=explore",
            "synchronizer.sync_method=checkpoint",
            "synchronizer.sync_style=trainer_driven",
        ],
    )
    assert config.synchronizer.sync_style == "fixed"
    found = problems(tmp_path, overrides=["explorer.over_rollout.ratio=0.5"])
    assert found == [
        "explorer.over_rollout.ratio = 0.5 applies only with synchronizer.sync_style "
        "explorer_driven or trainer_driven, not fixed"
    ]


def test_bad_dynamic_values_are_reported_together(tmp_path):
    found = problems(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=explorer_driven",
            "trainer.cpu_ranks=2",
            "explorer.over_rollout.ratio=1.0",
            "explorer.over_rollout.wait_after_min=-1",
            "explorer.dynamic_timeout.ratio=0",
        ],
    )
    assert [p for p in found if "cpu_ranks = 2 is not supported yet" in p]
    assert "explorer.over_rollout.ratio = 1.0 must be in [0, 1)" in " ".join(found)
    assert "explorer.over_rollout.wait_after_min = -1.0 must be >= 0" in found
    assert "explorer.dynamic_timeout.ratio = 0.0 must be > 0" in found


def test_dynamic_styles_with_over_rollout_and_dynamic_timeout_are_accepted(tmp_path):
    config = finalized(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=explorer_driven",
            "explorer.over_rollout.ratio=0.25",
            "explorer.dynamic_timeout.enable=true",
        ],
    )
    assert config.synchronizer.sync_style == "explorer_driven"


def test_a_steps_row_is_logged_before_its_experiences_are_written(tmp_path):
    """A run killed between the two resumes after the last step written and drops the rows
    logged after it: only this order leaves each step exactly one row."""
    config = finalized(tmp_path, overrides=["buffer.total_steps=3"])
    events = []

    def write(experiences, step):
        events.append(("write", step))

    def log(metrics, step):
        if "rollout/model_version" in metrics:
            events.append(("log", step))

    explorer = Explorer(config, Pool(), Reader(), {}, lambda want: 0, write, log)
    assert explorer.run() == 3
    assert events == [(kind, s) for s in (1, 2, 3) for kind in ("log", "write")]
