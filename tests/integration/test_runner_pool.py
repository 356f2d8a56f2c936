"""RunnerPool: several tasks per runner at once, and a stuck task only costs itself, with
runners as Ray actors and as threads of this process (a stage ``local_stage.py`` runs)."""

import time
from types import SimpleNamespace

import pytest
import ray

from trinity.explorer.pool import RunnerPool, ThreadRunner
from trinity.explorer.runner import TaskResult


class Sleepy:
    """Stands in for a workflow runner: a task sleeps; the result says when it ran."""

    def run_task(self, task: SimpleNamespace) -> TaskResult:
        start = time.time()
        time.sleep(task.sleep)
        return TaskResult(task={"name": task.name, "start": start, "end": time.time()})

    def close(self) -> None:
        """What a pool calls on a runner it gives up (a WorkflowRunner stops reporting)."""


SleepyActor = ray.remote(num_cpus=0, max_concurrency=4)(Sleepy)


@pytest.fixture(params=["ray", "threads"])
def make_runner(request):
    """``index -> runner``: a Ray actor (killed when given up on) or a thread per task in
    this process (abandoned when given up on)."""
    if request.param == "ray":
        from trinity.runtime.actors import RayRunner

        request.getfixturevalue("ray_cluster")
        return lambda i: RayRunner(SleepyActor.remote)
    return lambda i: ThreadRunner(Sleepy(), f"sleepy_{i}")


def _tasks(*sleeps: float, n: int = 1, names=None) -> list:
    """Tasks asking for ``n`` samples each (the pool reads ``rollout_args.n``)."""
    names = names or [f"t{i}" for i in range(len(sleeps))]
    args = SimpleNamespace(n=n)
    pairs = zip(names, sleeps, strict=True)
    return [SimpleNamespace(name=m, task_id=m, sleep=s, rollout_args=args) for m, s in pairs]


def _pool(
    make_runner, size: int, rows: int, max_timeout: float = 60.0, retries: int = 0
) -> RunnerPool:
    return RunnerPool(make_runner, size, max_timeout, rows, retries)


def _overlapping(ran: list) -> int:
    """The most tasks that were running at one moment."""
    return max(sum(t["start"] <= r["start"] < t["end"] for t in ran) for r in ran)


def test_a_runner_runs_its_slots_at_once(make_runner):
    results = _pool(make_runner, size=1, rows=4).run(_tasks(1.0, 1.0, 1.0, 1.0))
    ran = [r.task for r in results]
    assert sorted(t["name"] for t in ran) == ["t0", "t1", "t2", "t3"]
    # all four started before any finished: they ran together, not one after another
    assert max(t["start"] for t in ran) < min(t["end"] for t in ran)


def test_sequential_slots_run_one_task_at_a_time(make_runner):
    ran = [r.task for r in _pool(make_runner, size=1, rows=1).run(_tasks(0.2, 0.2, 0.2))]
    assert _overlapping(ran) == 1


def test_samples_in_flight_bound_tasks_that_ask_for_many(make_runner):
    # room for 4 samples: tasks of 2 samples run two at a time
    ran = [r.task for r in _pool(make_runner, size=1, rows=4).run(_tasks(0.5, 0.5, 0.5, 0.5, n=2))]
    assert len(ran) == 4 and _overlapping(ran) == 2


def test_a_stuck_task_times_out_and_its_runner_mates_are_rerun(make_runner):
    # Two slots: "stuck" and "quick" start at 0 s; "slow" takes quick's slot at ~1 s and is
    # still running (it would end at ~4.5 s, inside its own 4 s limit) when "stuck" hits its
    # limit at 4 s and the runner is killed.
    tasks = _tasks(60.0, 1.0, 3.5, names=["stuck", "quick", "slow"])
    results = _pool(make_runner, size=1, rows=2, max_timeout=4.0).run(tasks)
    # a finished task reports a dict; a timed-out one comes back as the task it was sent as
    by_name = {getattr(r.task, "name", None) or r.task["name"]: r for r in results}
    assert sorted(by_name) == ["quick", "slow", "stuck"] and len(results) == 3
    assert "timed out after explorer.max_timeout=4s" in by_name["stuck"].error
    assert by_name["stuck"].attempts == 1
    assert by_name["quick"].error is None
    # "slow" was in flight on the killed runner: it ran again, to completion, on the new one
    slow, quick = by_name["slow"], by_name["quick"]
    assert slow.error is None and slow.task["start"] > quick.task["start"] + 3.5


def test_a_timed_out_task_is_retried_then_reported_with_its_attempts(make_runner):
    (result,) = _pool(make_runner, size=1, rows=1, max_timeout=1.0, retries=2).run(_tasks(60.0))
    assert result.attempts == 3 and "timed out after explorer.max_timeout=1s" in result.error


def _named(results: list) -> dict:
    """Results by task name (a finished task reports a dict, the others the task sent)."""
    return {getattr(r.task, "name", None) or r.task["name"]: r for r in results}


def test_over_rollout_leaves_the_slowest_tasks_behind_and_the_pool_goes_on(make_runner):
    # 4 tasks, enough = 2: "a" and "b" finish at ~0.2 s, the wait_after_min of 0.5 s passes,
    # "c" (running, 30 s) is cancelled and "d" (never started: no free slot) is dropped.
    pool = _pool(make_runner, size=1, rows=3)
    tasks = _tasks(0.2, 0.2, 30.0, 30.0, names=["a", "b", "c", "d"])
    results = pool.run(tasks, "explore step 1", enough=2, wait_after_min=0.5)
    by_name = _named(results)
    assert sorted(by_name) == ["a", "b", "c", "d"]
    assert [n for n, r in sorted(by_name.items()) if r.left_behind] == ["c", "d"]
    assert all(r.error is None for r in results)
    assert by_name["c"].experiences == [] and by_name["d"].attempts == 0
    # the runner that held "c" was replaced: the next step runs on a fresh one
    (again,) = pool.run(_tasks(0.1, names=["e"]))
    assert again.task["name"] == "e" and not again.left_behind


def test_over_rollout_waits_for_stragglers_within_wait_after_min(make_runner):
    # enough = 1 at ~0.1 s; "slow" ends at ~1 s, inside the 20 s grace: nothing left behind
    results = _pool(make_runner, size=1, rows=2).run(
        _tasks(0.1, 1.0, names=["fast", "slow"]), enough=1, wait_after_min=20.0
    )
    assert sorted(_named(results)) == ["fast", "slow"]
    assert not any(r.left_behind for r in results)


def test_dynamic_timeout_cuts_a_task_far_slower_than_the_successful_ones(make_runner):
    from trinity.explorer.pool_rules import DynamicTimeout

    timeout = DynamicTimeout(max_timeout=60.0, ratio=3.0)
    pool = RunnerPool(make_runner, 1, 60.0, 3, 0, timeout=timeout)
    # all three start together, before any success (limit: max_timeout, 60 s); once q1 and
    # q2 succeed, "stuck" is cut at 3 x their mean time (about 1 s), not at 60 s
    results = _named(pool.run(_tasks(0.3, 0.3, 30.0, names=["q1", "q2", "stuck"])))
    assert results["q1"].error is None and results["q2"].error is None
    (mean,) = [total / count for total, count in timeout.totals.values()]
    assert mean >= 0.3
    error = results["stuck"].error
    assert error.startswith(f"timed out after {3 * mean:.3g}s (explorer.dynamic_timeout: 3 x")
    assert "the mean time of 2 successful task(s) like it" in error
