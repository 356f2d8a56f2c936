"""AsyncWorkflowRunner (``concurrent_mode: asynchronous``): many tasks on one event loop.

The runner shares its retry loop with ``WorkflowRunner``; these tests pin what the async
body must add: tasks really overlap on one loop (their model calls join the engine's batch
together), a raising coroutine is retried, each task's experiences carry the versions *it*
saw although all tasks share one thread, and blocking workflows still run (in worker
threads).
"""

import asyncio
import threading
from typing import List

import pytest

from trinity.common.experience import Experience
from trinity.common.workflows import Task, Workflow
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.explorer.runner import AsyncWorkflowRunner, WorkflowRunner

from .joins import record_joins


@pytest.fixture()
def engine(micro_model):
    # Room for a three-turn conversation of the character-level micro model.
    return TransformersInferenceModel(
        model_path=micro_model, max_model_len=256, max_prompt_tokens=200, max_response_tokens=4
    )


def _runner(engine, retries: int = 2, threads: int = 1) -> AsyncWorkflowRunner:
    return AsyncWorkflowRunner(
        engine, default_params={"max_tokens": 4}, max_retry_times=retries, threads=threads
    )


async def _run_all(runner: AsyncWorkflowRunner, tasks: List[Task]) -> list:
    return await asyncio.gather(*(runner.run_task(t) for t in tasks))


def _tasks(workflow: type, count: int, **workflow_args) -> List[Task]:
    return [
        Task(workflow=workflow, task_id=f"t{i}", index=i, workflow_args=workflow_args)
        for i in range(count)
    ]


class ThreeTurns(Workflow):
    """Three replies in one conversation; records the thread each task ran on."""

    async def run_async(self) -> List[Experience]:
        self.task.workflow_args["threads"].add(threading.get_ident())
        messages = [{"role": "user", "content": f"{self.task.index}+1="}]
        for _ in range(3):
            (reply,) = await self.model.chat_async(messages, n=1)
            messages.append({"role": "assistant", "content": reply.response_text})
            messages.append({"role": "user", "content": "again"})
        reply.reward = 1.0
        return [reply]


def test_tasks_overlap_on_one_loop_and_their_turns_batch_together(engine):
    joins = record_joins(engine.engine)
    threads: set = set()
    results = asyncio.run(_run_all(_runner(engine), _tasks(ThreeTurns, 8, threads=threads)))
    assert all(r.error is None and r.attempts == 1 for r in results)
    assert [r.experiences[0].group_id for r in results] == [f"t{i}" for i in range(8)]
    # the 8 first turns joined at one step (one prefill): 8 tasks in flight at once; later
    # turns join as the task's previous reply ends, several at a step
    batches = [len(joined) for joined in joins]
    assert batches[0] == 8 and sum(batches) == 24 and len(batches) < 24
    assert threads == {threading.get_ident()}  # all on the loop's thread


class FailsTwice(Workflow):
    """Raises in its first two attempts (counted in workflow_args), then succeeds."""

    async def run_async(self) -> List[Experience]:
        calls = self.task.workflow_args["calls"]
        calls.append(self)
        await asyncio.sleep(0)
        if len(calls) <= 2:
            raise RuntimeError(f"flaky environment, attempt {len(calls)}")
        return [Experience(tokens=[1, 2, 3], prompt_length=1, reward=1.0)]

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task


def test_a_raising_coroutine_is_retried_with_a_fresh_workflow(engine):
    calls: list = []
    runner, tasks = _runner(engine, retries=2), _tasks(FailsTwice, 1, calls=calls)
    (result,) = asyncio.run(_run_all(runner, tasks))
    assert result.error is None and result.attempts == 3
    assert len(result.experiences) == 1
    # a workflow that raised is never reused: each attempt built its own
    assert len({id(w) for w in calls}) == 3


def test_a_coroutine_that_keeps_raising_is_reported_with_its_traceback(engine):
    calls: list = []
    runner, tasks = _runner(engine, retries=1), _tasks(FailsTwice, 1, calls=calls)
    (result,) = asyncio.run(_run_all(runner, tasks))
    assert result.attempts == 2 and result.experiences == []
    assert "RuntimeError: flaky environment, attempt 2" in result.error
    assert "in run_async" in result.error


class Interleaved(Workflow):
    """Task "a" samples at the old weights, task "b" loads new ones and samples, then "a"
    samples again: both run on one thread, interleaved by events."""

    async def run_async(self) -> List[Experience]:
        args = self.task.workflow_args
        ask = [{"role": "user", "content": "1+1="}]
        if self.task.raw_task["role"] == "a":
            first = await self.model.chat_async(ask, n=2)
            args["a_sampled"].set()
            await args["b_sampled"].wait()
            return first + await self.model.chat_async(ask, n=1)
        await args["a_sampled"].wait()
        await self.model.engine.load_weights(self.model.engine.engine.model.state_dict(), 7)
        replies = await self.model.chat_async(ask, n=2)
        args["b_sampled"].set()
        return replies


def test_each_task_is_stamped_with_the_versions_it_saw(engine):
    async def main():
        await engine.load_weights(engine.engine.model.state_dict(), 5)
        args = dict(a_sampled=asyncio.Event(), b_sampled=asyncio.Event())
        tasks = [
            Task(workflow=Interleaved, task_id=role, raw_task={"role": role}, workflow_args=args)
            for role in ("a", "b")
        ]
        return await _run_all(_runner(engine), tasks)

    a, b = asyncio.run(main())
    assert a.error is None and b.error is None
    # "a" saw versions 5 and 7: the oldest; "b" saw only 7, though "a" was mid-task then
    assert [e.model_version for e in a.experiences] == [5, 5, 5]
    assert [e.model_version for e in b.experiences] == [7, 7]


class Blocking(Workflow):
    """Only a blocking ``run``: waits until ``parties`` tasks run at once, makes no model call."""

    def run(self) -> List[Experience]:
        args = self.task.workflow_args
        args["threads"].add(threading.get_ident())
        args["barrier"].wait(timeout=30)  # broken (raises) unless all tasks run at once
        return [Experience(tokens=[1, 2, 3], prompt_length=1, reward=0.5)]


def test_blocking_workflows_run_in_as_many_threads_as_the_runner_has(engine):
    threads: set = set()
    barrier = threading.Barrier(4)

    async def main():
        await engine.load_weights(engine.engine.model.state_dict(), 3)
        tasks = _tasks(Blocking, 4, threads=threads, barrier=barrier)
        return threading.get_ident(), await _run_all(_runner(engine, threads=4), tasks)

    loop_thread, results = asyncio.run(main())
    assert all(r.error is None for r in results), results[0].error
    # no model call: stamped with the engine's version, asked without blocking the loop
    assert [r.experiences[0].model_version for r in results] == [3, 3, 3, 3]
    assert len(threads) == 4 and loop_thread not in threads


class AsyncOnly(Workflow):
    async def run_async(self) -> List[Experience]:
        return await self.model.chat_async([{"role": "user", "content": "2+2="}], n=2)


class Neither(Workflow):
    pass


def test_a_thread_runner_runs_an_async_only_workflow(engine):
    result = WorkflowRunner(engine, default_params={"max_tokens": 4}).run_task(
        Task(workflow=AsyncOnly, task_id="t")
    )
    assert result.error is None and len(result.experiences) == 2


class KeepsALoopBoundObject(Workflow):
    """Resettable and async-only; keeps an ``asyncio.Event`` (bound to the loop that first
    waits on it, as an ``AsyncOpenAI`` client's connections are) across tasks."""

    async def run_async(self) -> List[Experience]:
        if not hasattr(self, "event"):
            self.event = asyncio.Event()
        self.event.set()
        await self.event.wait()  # raises if the event was bound to another loop
        self.task.workflow_args["instances"].append(id(self))
        return [Experience(tokens=[1, 2], prompt_length=1, reward=0.0)]

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task


def test_a_reused_async_only_workflow_keeps_its_loop_in_a_thread_runner(engine):
    runner = WorkflowRunner(engine, default_params={}, max_retry_times=0)
    instances: list = []
    for task in _tasks(KeepsALoopBoundObject, 2, instances=instances):
        result = runner.run_task(task)
        assert result.error is None, result.error
    assert len(instances) == 2 and instances[0] == instances[1]  # one instance, reused


@pytest.mark.parametrize("runner_cls", [WorkflowRunner, AsyncWorkflowRunner])
def test_a_workflow_defining_neither_method_is_reported(engine, runner_cls):
    runner = runner_cls(engine, default_params={}, max_retry_times=0)
    task = Task(workflow=Neither, task_id="t")
    result = runner.run_task(task)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    assert "Neither must define run() or run_async()" in result.error


class Reusable(Workflow):
    """Resettable; holds each task until every task has started (so all run at once)."""

    async def run_async(self) -> List[Experience]:
        args = self.task.workflow_args
        args["instances"].append(id(self))
        if len(args["instances"]) == args["together"]:
            args["all_started"].set()
        await args["all_started"].wait()
        return [Experience(tokens=[1, 2], prompt_length=1, reward=0.0)]

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task


def test_tasks_running_at_once_never_share_a_workflow_instance(engine):
    instances: list = []

    async def main():
        runner = _runner(engine)
        together = dict(instances=instances, together=3, all_started=asyncio.Event())
        await _run_all(runner, _tasks(Reusable, 3, **together))
        later = dict(instances=instances, together=4, all_started=asyncio.Event())
        later["all_started"].set()
        return await _run_all(runner, _tasks(Reusable, 1, **later))

    (result,) = asyncio.run(main())
    assert result.error is None
    assert len(set(instances[:3])) == 3  # three at once: three instances
    assert instances[3] in instances[:3]  # afterwards one of them is reused
