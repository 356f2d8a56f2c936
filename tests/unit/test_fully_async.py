"""``sync_style: fully_async`` in the plain ``Explorer`` and ``RunnerPool.stream``, and the
staleness bound (``synchronizer.max_staleness``): its defaults per style, its checks, and the
trainer-side filter on hand-made versions."""

import concurrent.futures

import pytest

from tests.unit.test_config_finalize import fake_algorithms, finalized, problems  # noqa: F401
from trinity.common.experience import Experience
from trinity.common.sync_schedule import Wanted
from trinity.common.workflows.workflow import Task
from trinity.explorer.explorer import Explorer
from trinity.explorer.pool import RunnerPool
from trinity.explorer.runner import TaskResult
from trinity.runtime.queue_reader import StaleFilter


class Reader:
    def __init__(self, rows=None):
        self.read_calls, self.rows, self.next = 0, rows, 0

    def read(self, n):
        if self.rows is not None and self.next >= self.rows:
            raise StopIteration
        self.read_calls += 1
        tasks = [Task(taskset_name="train", index=self.next + i) for i in range(n)]
        self.next += n
        return tasks

    def read_all(self):
        return [Task(taskset_name="test", index=0, is_eval=True)]

    def feedback(self, rewards):
        pass


class LifoPool:
    """``stream`` with ``capacity`` tasks in flight, finishing the newest first: later steps
    complete before earlier ones. ``run`` (evaluations) returns at once."""

    def __init__(self, capacity, version):
        self.capacity, self.version, self.order, self.evals = capacity, version, [], []

    def run(self, tasks, label="", enough=None, wait_after_min=0.0):
        self.evals.append(label)
        return [TaskResult(task=t) for t in tasks]

    def stream(self, first, more, on_result, label=""):
        todo, flight = list(first), []
        while True:
            if self.capacity - len(flight) > len(todo):
                todo += more(self.capacity - len(flight) - len(todo))
            while todo and len(flight) < self.capacity:
                flight.append(todo.pop(0))
            if not flight:
                return
            task = flight.pop()  # the newest
            self.order.append(task.task_id)
            exp = Experience(tokens=[1, 2, 3], prompt_length=2, model_version=self.version())
            exp.group_id = task.task_id  # as the runner sets it
            on_result(TaskResult(task=task, experiences=[exp]))


def run_explorer(tmp_path, *overrides, rows=None):
    config = finalized(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=fully_async",
            "buffer.batch_size=2",
            *overrides,
        ],
    )
    asked, written, logged = [], [], {}
    versions = iter(range(100))
    pool = LifoPool(capacity=3, version=lambda: 7)

    def sync(want):
        asked.append((reader.read_calls, want))
        return next(versions)

    def write(exps, step):
        written.append((step, sorted({e.group_id for e in exps})))

    def log(metrics, step):
        logged.setdefault(step, []).append(metrics)

    reader = Reader(rows)
    explorer = Explorer(config, pool, reader, {"test": Reader()}, sync, write, log)
    return explorer.run(), asked, written, logged, pool


def test_steps_overlap_finish_out_of_order_and_are_written_in_order_whole(tmp_path):
    # a bound no step reaches here (the floor has its own test)
    last, asked, written, logged, pool = run_explorer(
        tmp_path, "buffer.total_steps=5", "synchronizer.max_staleness=5"
    )
    assert last == 5
    # a later step's task finished before an earlier step's (the pool runs newest first)...
    first_done = [int(task_id.split("-")[1]) for task_id in pool.order]
    assert first_done != sorted(first_done)
    # ...yet each step is written once, in order, with exactly its own two tasks
    assert written == [(s, [f"train-{s}-train-{2 * (s - 1)}", f"train-{s}-train-{2 * s - 1}"])
                       for s in range(1, 6)]  # fmt: skip
    # the newest weights are loaded before each step's tasks are handed out, never waited for
    assert [want for _, want in asked[:5]] == [Wanted(0)] * 5
    assert [reads for reads, _ in asked[:5]] == [1, 2, 3, 4, 5]  # just after each read
    # the version logged is the oldest that sampled the step (the experiences say 7)
    assert [logged[s][0]["rollout/model_version"] for s in range(1, 6)] == [7.0] * 5


def test_sync_offset_keeps_the_starting_weights_for_its_steps(tmp_path):
    _, asked, _, _, _ = run_explorer(
        tmp_path,
        "buffer.total_steps=4",
        "synchronizer.sync_offset=2",
        "synchronizer.max_staleness=3",
    )
    assert [want for _, want in asked[:4]] == [Wanted(None), Wanted(None), Wanted(0), Wanted(0)]


def test_an_evaluation_waits_for_the_steps_before_it_and_the_last_for_the_trainer(tmp_path):
    _, asked, written, _, pool = run_explorer(
        tmp_path, "buffer.total_steps=5", "explorer.eval_interval=2", "synchronizer.max_staleness=5"
    )
    assert pool.evals == [
        "eval of test at step 0",
        "eval of test at step 2",
        "eval of test at step 4",
        "eval of test at step 5",
    ]
    # (reads so far, what was loaded): each read loads the newest weights; the evaluations
    # at steps 2 and 4 load them too, before the next step is read (they need the runners);
    # the last waits for the trainer's final weights
    now, final = Wanted(0), Wanted(None, final=True)
    assert asked == [
        (1, now),
        (2, now),
        (2, now),
        (3, now),
        (4, now),
        (4, now),
        (5, now),
        (5, final),
    ]
    assert [s for s, _ in written] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("bound", [0, 1, 5])
def test_no_step_is_handed_out_on_weights_too_stale_for_its_train_step(tmp_path, bound):
    """A trainer that trains and publishes each step as soon as it is written: explore step
    ``s`` (read by train step ``s``, which updates version ``s - 1``) is handed out only once
    the explorer holds version ``s - 1 - bound``; steps in flight are collected meanwhile."""
    config = finalized(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=fully_async",
            "buffer.batch_size=2",
            "buffer.total_steps=6",
            f"synchronizer.max_staleness={bound}",
        ],
    )
    written, logged = [], {}

    def sync(want):  # the newest the trainer published: one version per written step
        assert want.version is None or want.version <= len(written), "would wait forever"
        return len(written)

    def log(metrics, step):
        logged.setdefault(step, []).append(metrics)

    pool = LifoPool(capacity=6, version=lambda: explorer.version)
    explorer = Explorer(
        config, pool, Reader(), {}, sync, lambda exps, step: written.append(step), log
    )
    assert explorer.run() == 6 and written == [1, 2, 3, 4, 5, 6]
    versions = [logged[s][0]["rollout/model_version"] for s in range(1, 7)]
    assert all(v >= s - 1 - bound for s, v in enumerate(versions, 1)), versions
    if bound == 5:  # nothing holds the explorer back: it runs ahead on the starting weights
        assert versions[:6] == [0.0] * 6


def test_the_end_of_the_taskset_ends_the_run(tmp_path):
    last, _, written, _, _ = run_explorer(tmp_path, rows=7)  # 4 reads of 2: the last short
    assert last == 4 and [s for s, _ in written] == [1, 2, 3, 4]


class InstantRunner:
    def __init__(self):
        self.sent = []

    def submit(self, task):
        self.sent.append(task.task_id)
        future = concurrent.futures.Future()
        future.set_result(TaskResult(task=task))
        return future

    def start(self):
        pass

    def ready(self):
        pass

    def stop(self):
        pass


def test_pool_stream_asks_for_as_many_tasks_as_slots_are_free_until_none_come():
    runners = [InstantRunner(), InstantRunner()]
    pool = RunnerPool(lambda i: runners[i], size=2, max_timeout=10, rows=2)  # 2 slots each
    batches = iter([[Task(task_id=f"t{i}{j}") for j in range(3)] for i in range(1, 4)])
    asked, seen = [], []

    def more(slots):
        asked.append(slots)
        return next(batches, [])

    pool.stream([Task(task_id="t00")], more, lambda r: seen.append(r.task.task_id))
    assert sorted(seen) == ["t00"] + [f"t{i}{j}" for i in range(1, 4) for j in range(3)]
    assert asked[0] == 3  # 4 slots, one task queued
    assert asked[-1] > 0 and len(asked) >= 4
    assert sum(len(r.sent) for r in runners) == 10


# ---- the staleness bound ---------------------------------------------------------------


@pytest.mark.parametrize(
    "style, interval, offset, expected",
    [
        ("fixed", 1, 0, None),  # the schedule bounds it: off
        ("explorer_driven", 1, 0, 2),
        ("trainer_driven", 2, 1, 4),
        ("fully_async", 1, 3, 5),
    ],
)
def test_max_staleness_default_per_style(tmp_path, style, interval, offset, expected):
    config = finalized(
        tmp_path,
        overrides=[
            f"synchronizer.sync_style={style}",
            f"synchronizer.sync_interval={interval}",
            f"synchronizer.sync_offset={offset}",
        ],
    )
    assert config.synchronizer.max_staleness == expected


def test_a_bound_that_can_never_be_met_names_both_keys(tmp_path):
    found = problems(
        tmp_path,
        overrides=[
            "synchronizer.sync_style=fully_async",
            "synchronizer.sync_offset=3",
            "synchronizer.max_staleness=2",
        ],
    )
    assert found == [
        "synchronizer.max_staleness = 2 is below synchronizer.sync_offset = 3: the steps "
        "explored on the starting weights could never be trained on; raise it to at least 3 "
        "or lower sync_offset"
    ]
    found = problems(
        tmp_path,
        overrides=["synchronizer.sync_interval=3", "synchronizer.max_staleness=1"],
    )
    assert len(found) == 1 and found[0].startswith(
        "synchronizer.max_staleness = 1 is below what sync_style fixed produces with "
        "synchronizer.sync_interval = 3 and synchronizer.sync_offset = 0 "
        "(sync_interval + sync_offset - 1 = 2)"
    )


def test_over_rollout_is_refused_with_fully_async(tmp_path):
    found = problems(
        tmp_path,
        overrides=["synchronizer.sync_style=fully_async", "explorer.over_rollout.ratio=0.5"],
    )
    assert found == [
        "explorer.over_rollout.ratio = 0.5 applies only with synchronizer.sync_style "
        "explorer_driven or trainer_driven, not fully_async (its steps never wait for their "
        "last tasks)"
    ]


class QueueLike:
    """Experiences as ``(group, version)``, read in order; records each read's size."""

    def __init__(self, rows):
        self.rows = [
            Experience(tokens=[1, 2], prompt_length=1, group_id=g, model_version=v) for g, v in rows
        ]
        self.reads, self.steps = [], []

    def begin_step(self, step):
        self.steps.append(step)

    def read(self, n, timeout=None):
        if not self.rows:
            raise StopIteration
        self.reads.append(n)
        out, self.rows = self.rows[:n], self.rows[n:]
        return out


def test_stale_filter_drops_whole_groups_reads_on_and_reports_the_step():
    # train step 6 updates version 5: staleness = 5 - version. Bound 2 keeps versions >= 3.
    queue = QueueLike([("a", 4), ("a", 4), ("b", 3), ("b", 2), ("c", 5), ("c", 5), ("d", 1)])
    stale = StaleFilter(queue, bound=2)
    stale.begin_step(6)
    kept = stale.read(4)
    # read 4: a a b b -> group b has a version-2 member (staleness 3): both dropped;
    # read 2: c c kept -> 4 fresh
    assert [(e.group_id, e.model_version) for e in kept] == [("a", 4), ("a", 4), ("c", 5), ("c", 5)]
    assert queue.reads == [4, 2] and queue.steps == [1, 6]
    assert stale.step_metrics() == {
        "staleness/dropped": 2.0,
        "staleness/max": 1.0,  # a: 5 - 4
        "staleness/mean": 0.5,  # (1 + 1 + 0 + 0) / 4
    }
    stale.begin_step(7)  # a new step starts its own figures
    with pytest.raises(StopIteration):  # only a stale row (d, staleness 6) is left
        stale.read(1)
    assert stale.step_metrics() == {"staleness/dropped": 1.0}
