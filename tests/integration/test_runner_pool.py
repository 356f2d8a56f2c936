"""RayRunnerPool: several tasks per runner at once, and a stuck task only costs itself."""

import time

import ray

from trinity.explorer.runner import TaskResult
from trinity.runtime.actors import RayRunnerPool


@ray.remote(num_cpus=0, max_concurrency=4)
class SleepyRunner:
    """Stands in for a RunnerActor: a task is {"name", "sleep"}; it reports when it ran."""

    def run_task(self, task: dict) -> TaskResult:
        start = time.time()
        time.sleep(task["sleep"])
        return TaskResult(task={**task, "start": start, "end": time.time()})


def _pool(size: int, slots: int, max_timeout: float = 60.0) -> RayRunnerPool:
    return RayRunnerPool(lambda i: SleepyRunner.remote(), size, max_timeout, slots)


def test_a_runner_runs_its_slots_at_once(ray_cluster):
    tasks = [{"name": f"t{i}", "sleep": 1.0} for i in range(4)]
    results = _pool(size=1, slots=4).run(tasks)
    ran = [r.task for r in results]
    assert sorted(t["name"] for t in ran) == ["t0", "t1", "t2", "t3"]
    # all four started before any finished: they ran together, not one after another
    assert max(t["start"] for t in ran) < min(t["end"] for t in ran)


def test_sequential_slots_run_one_task_at_a_time(ray_cluster):
    tasks = [{"name": f"t{i}", "sleep": 0.2} for i in range(3)]
    ran = sorted((r.task for r in _pool(size=1, slots=1).run(tasks)), key=lambda t: t["start"])
    assert all(a["end"] <= b["start"] for a, b in zip(ran, ran[1:], strict=False))


def test_a_stuck_task_times_out_and_its_runner_mates_are_rerun(ray_cluster):
    # Two slots: "stuck" and "quick" start at 0 s; "slow" takes quick's slot at ~1 s and is
    # still running (it would end at ~4.5 s, inside its own 4 s limit) when "stuck" hits its
    # limit at 4 s and the runner is killed.
    tasks = [
        {"name": "stuck", "sleep": 60.0},
        {"name": "quick", "sleep": 1.0},
        {"name": "slow", "sleep": 3.5},
    ]
    results = _pool(size=1, slots=2, max_timeout=4.0).run(tasks)
    by_name = {r.task["name"]: r for r in results}
    assert sorted(by_name) == ["quick", "slow", "stuck"] and len(results) == 3
    assert "timed out after explorer.max_timeout=4.0s" in by_name["stuck"].error
    assert by_name["quick"].error is None
    # "slow" was in flight on the killed runner: it ran again, to completion, on the new one
    assert by_name["slow"].error is None and by_name["slow"].task["start"] > 3.5 + min(
        r.task.get("start", 1e18) for r in results
    )
