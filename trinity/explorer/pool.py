"""The runner pool: the explorer's tasks on a few workflow runners, with time limits, retries
and over-rollout.

A runner is anything with ``submit(task) -> concurrent.futures.Future`` (of a ``TaskResult``),
``start()`` (begin starting, not waiting), ``ready()`` (block until it takes tasks) and
``stop()`` (give it up, tasks in flight included): a Ray runner actor (``actors.RayRunner``),
or in a stage that runs in one process a ``ThreadRunner`` (a ``WorkflowRunner`` with a thread
per task) or a ``LoopRunner`` (an ``AsyncWorkflowRunner`` on an event loop of its own).
Extending: another kind of runner implements those four methods; the pool does not change.
The pool starts a runner when it first sends it a task (those sent at once together), so a
step that keeps fewer runners busy than the pool holds starts no more.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from trinity.common.workflows.workflow import Task
from trinity.explorer.pool_rules import DynamicTimeout, OverRollout
from trinity.explorer.runner import TaskResult
from trinity.utils.loop_host import LoopHost
from trinity.utils.status import Reporter

logger = logging.getLogger(__name__)


class Runner(Protocol):
    def submit(self, task: Task) -> concurrent.futures.Future: ...

    def start(self) -> None: ...

    def ready(self) -> None: ...

    def stop(self) -> None: ...


class ThreadRunner:
    """A ``WorkflowRunner`` in this process, each task in a thread of its own.

    Threads are daemons: a task given up on (timed out, left behind) cannot be stopped, so
    its thread is abandoned, its result dropped, and it never holds the process open.
    """

    def __init__(self, runner: Any, name: str) -> None:
        self.runner, self.name = runner, name

    def submit(self, task: Task) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            try:
                future.set_result(self.runner.run_task(task))
            except BaseException as exc:  # the pool reports it as a lost attempt
                future.set_exception(exc)

        future.set_running_or_notify_cancel()
        threading.Thread(target=work, name=f"{self.name}:{task.task_id}", daemon=True).start()
        return future

    def start(self) -> None:
        pass

    def ready(self) -> None:
        pass

    def stop(self) -> None:
        """Its state reports stop; its threads run on, abandoned (see the class docstring)."""
        self.runner.close()


class LoopRunner:
    """An ``AsyncWorkflowRunner`` on an event loop of its own thread (``LoopHost``): its tasks
    are coroutines there, and stopping it cancels them."""

    def __init__(self, make: Callable[[], Any], name: str) -> None:
        self.host = LoopHost(make, name)

    def submit(self, task: Task) -> concurrent.futures.Future:
        return self.host.submit("run_task", task)

    def start(self) -> None:
        pass

    def ready(self) -> None:
        pass

    def stop(self) -> None:
        self.host.hosted.close()
        self.host.close(wait=False)  # a coroutine stuck in a blocking call keeps the loop


class RunnerPool:
    """Runs tasks on ``size`` runners from ``make_runner(index)`` with ``explorer.max_timeout``
    per task (or the limit of ``timeout``, a ``DynamicTimeout``: ``explorer.dynamic_timeout``).

    Each runner holds at most ``rows`` samples' worth of tasks at once (a task asks for
    ``rollout_args.n``; always at least one task, so ``rows=1`` is sequential): a training
    step's 8-sample tasks go a few at a time, one-sample eval tasks many at a time, so the
    engine sees similar batches for both. A runner that times out or dies is stopped and
    replaced, so one stuck workflow never stalls the step; the task that timed out (or was
    running when its runner died) is retried up to ``max_retry_times`` times, the runner's
    other in-flight tasks start again on the new runner without counting an attempt.

    With ``enough`` (``explorer.over_rollout``) a run returns ``wait_after_min`` seconds
    after that many tasks finished: the tasks still running are cancelled (their runners
    replaced) and come back, with those never started, as ``left_behind`` results.
    """

    # A task running longer than this is reported as what the explorer waits for.
    REPORT_AFTER_S = 5.0

    def __init__(
        self,
        make_runner: Callable[[int], Runner],
        size: int,
        max_timeout: float,
        rows: int = 1,
        max_retry_times: int = 0,
        report: Optional[Reporter] = None,
        timeout: Optional[DynamicTimeout] = None,
    ) -> None:
        self.make_runner = make_runner
        self.runners = [make_runner(i) for i in range(size)]
        self.timeout = timeout or DynamicTimeout(max_timeout)
        self.rows = rows
        self.max_retry_times = max_retry_times
        self.report = report

    def _tasks_per_runner(self, tasks: List[Task]) -> int:
        n = max((task.rollout_args.n for task in tasks), default=1)
        return max(1, self.rows // max(1, n))

    def run(
        self,
        tasks: List[Task],
        label: str = "",
        enough: Optional[int] = None,
        wait_after_min: float = 0.0,
    ) -> List[TaskResult]:
        """Run ``tasks`` to the end (or, with ``enough``, as ``explorer.over_rollout`` says)."""
        results: List[TaskResult] = []
        cutoff = None if enough is None else OverRollout(tasks, enough, wait_after_min)
        per_runner = self._tasks_per_runner(tasks)
        self._drive(deque(tasks), per_runner, label, results.append, cutoff=cutoff)
        return results

    def stream(
        self,
        first: List[Task],
        more: Callable[[int], List[Task]],
        on_result: Callable[[TaskResult], None],
        label: str = "",
    ) -> None:
        """Keep every runner busy: ``first``, then ``more(free_slots)`` whenever a slot is
        free (an empty list: nothing more for now), each result handed to ``on_result`` as
        it comes. Returns once ``more`` has nothing and no task is in flight
        (``synchronizer.sync_style: fully_async``)."""
        self._drive(deque(first), self._tasks_per_runner(first), label, on_result, more=more)

    def _drive(
        self,
        todo: deque,
        per_runner: int,
        label: str,
        on_result: Callable[[TaskResult], None],
        cutoff: Optional[OverRollout] = None,
        more: Optional[Callable[[int], List[Task]]] = None,
    ) -> None:
        # One wait per run, dated from its start: the console prints a wait once when it
        # begins and then every so often, not at every task that finishes.
        began = time.time()
        # popped from the end: runner 0, 1, 2... first (each on the next engine), and one that
        # ends a task takes the next; runners that start at their first task (Ray's) stay
        # unstarted while a step needs fewer
        free = [runner for _ in range(per_runner) for runner in reversed(self.runners)]
        pending: Dict[Any, tuple] = {}  # future -> (task, runner, started: monotonic)
        lost: Dict[int, int] = {}  # id(task) -> attempts lost to timeouts and dead runners
        while True:
            if more is not None and len(free) > len(todo):
                todo.extend(more(len(free) - len(todo)))
            if not (todo or pending):
                break
            sent = []
            while todo and free:
                sent.append((free.pop(), todo.popleft()))
            self._ready({id(runner): runner for runner, _ in sent}.values())
            for runner, task in sent:
                pending[runner.submit(task)] = (task, runner, time.monotonic())
            # Wake at the next deadline at the latest, so a timeout is noticed on time. A
            # limit follows the successes so far: a task sent before any is cut once they come.
            first = min(t0 + self.timeout.limit(task) for task, _, t0 in pending.values())
            left = cutoff.seconds_left() if cutoff is not None else None
            wait = min(1.0, first - time.monotonic(), 1.0 if left is None else left)
            done, _ = concurrent.futures.wait(
                list(pending), timeout=max(0.01, wait), return_when="FIRST_COMPLETED"
            )
            ended = [self._collect(f, pending, lost, todo, free, per_runner) for f in done]
            now = time.monotonic()
            for future, (task, runner, started) in list(pending.items()):
                if future in pending and now - started > self.timeout.limit(task):
                    pending.pop(future)
                    msg = f"timed out after {self.timeout.describe(task)}"
                    ended.append((task, self._lost(task, msg, lost, todo)))
                    self._restart(runner, pending, todo, free, per_runner)
            for task, result in ended:
                if result is not None:  # None: the task goes again
                    on_result(result)
                    if cutoff is not None:
                        cutoff.finish(task)
            if cutoff is not None and cutoff.expired() and (todo or pending):
                for result in self._leave_behind(label, todo, pending):
                    on_result(result)
            self._report(pending, label, began)
        if self.report is not None:
            self.report.done()

    def _collect(
        self, future: Any, pending: Dict, lost: Dict[int, int], todo: deque, free: List, per: int
    ) -> Tuple[Task, Optional[TaskResult]]:
        """(task as sent, its result; None when the task goes again). A success's time
        feeds the dynamic timeout. A runner catches what its workflows raise: an error here
        is the runner's own (a Ray actor that died)."""
        task, runner, started = pending.pop(future)
        try:
            result = future.result()
        except Exception as exc:
            gave_up = self._lost(task, f"its workflow runner died: {exc}", lost, todo)
            self._restart(runner, pending, todo, free, per)
            return task, gave_up
        free.append(runner)
        if result.error is None:
            self.timeout.record(task, time.monotonic() - started)
        return task, result

    @staticmethod
    def _ready(runners: Any) -> None:
        """Start ``runners`` together and wait for them: a task's time limit starts when it
        is sent, so its runner must be up before that."""
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.ready()

    def _leave_behind(self, label: str, todo: deque, pending: Dict) -> List[TaskResult]:
        """over_rollout: the step goes on. Tasks still running are cancelled (their runners
        stopped and replaced: a running workflow cannot be stopped otherwise), tasks not
        started are dropped; all come back as ``left_behind`` results."""
        behind = [task for task, _, _ in pending.values()] + list(todo)
        busy = list({id(runner): runner for _, runner, _ in pending.values()}.values())
        pending.clear()
        todo.clear()
        for runner in busy:
            runner.stop()
        indexes = [self.runners.index(runner) for runner in busy]
        for index in indexes:
            self.runners[index] = self.make_runner(index)
        names = ", ".join(task.task_id for task in behind)
        logger.info("%s goes on without %d task(s): %s", label, len(behind), names)
        return [TaskResult(task=task, left_behind=True) for task in behind]

    def _lost(
        self, task: Task, why: str, lost: Dict[int, int], todo: deque
    ) -> Optional[TaskResult]:
        """Retry a task whose attempt was lost (timeout, dead runner), or give up on it."""
        attempts = lost[id(task)] = lost.get(id(task), 0) + 1
        if attempts <= self.max_retry_times:
            logger.warning("task %s %s; retrying (attempt %d)", task.task_id, why, attempts + 1)
            todo.appendleft(task)
            return None
        return TaskResult(task=task, error=why, attempts=attempts)

    def _report(self, pending: Dict[Any, tuple], label: str, began: float) -> None:
        """Say what the run waits for once a task has run ``REPORT_AFTER_S``."""
        if self.report is None or not pending:
            return
        task, _, started = min(pending.values(), key=lambda item: item[2])
        if time.monotonic() - started > self.REPORT_AFTER_S:
            self.report.wait(
                f"{len(pending)} task(s) of {label} to finish; the oldest, {task.task_id}, may "
                f"run {self.timeout.describe(task)}",
                since=began,
            )

    def _restart(
        self, runner: Any, pending: Dict[Any, tuple], todo: deque, free: List, per_runner: int
    ) -> None:
        """Replace ``runner``; the tasks it still held go back to the front of the queue."""
        for future, (task, owner, _) in list(pending.items()):
            if owner is runner:
                pending.pop(future)
                todo.appendleft(task)
        free[:] = [r for r in free if r is not runner]
        index = self.runners.index(runner)
        runner.stop()
        self.runners[index] = self.make_runner(index)
        free.extend([self.runners[index]] * per_runner)
