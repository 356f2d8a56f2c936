"""Workflow runners: run one task's workflow with retries and return its experiences.

``WorkflowRunner`` runs a task in the calling thread; ``AsyncWorkflowRunner`` runs it as a
coroutine, so one event loop holds many tasks at once. Both share one retry loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, List, Optional

from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows.workflow import Task, Workflow
from trinity.explorer.runner_state import RunnerState, start_reporting
from trinity.utils.status import Reporter


@dataclass
class TaskResult:
    task: Task
    experiences: List[Experience] = field(default_factory=list)
    error: Optional[str] = None  # the last attempt's traceback when every attempt failed
    seconds: float = 0.0
    attempts: int = 0
    left_behind: bool = False  # over_rollout: cancelled when its step went on without it


class WorkflowRunner:
    """Runs tasks' workflows in the calling thread (``concurrent_mode`` ``sequential`` or
    ``multi-threading``: one task per thread, several threads at once)."""

    def __init__(
        self,
        engine: Any,
        default_params: Dict[str, Any],
        max_retry_times: int = 2,
        auxiliary_engines: Optional[List] = None,
        enable_history: bool = False,
        report: Optional[Reporter] = None,
        report_interval: float = 0,
    ) -> None:
        """``auxiliary_engines``: one engine of each of ``explorer.auxiliary_models``; workflows
        get an ``openai.OpenAI`` for each (the developer guide's ``auxiliary_models``).
        ``report``: where this runner's state goes every ``report_interval`` seconds (0: never;
        ``explorer.runner_state_report_interval``)."""
        self.model = ModelWrapper(engine, default_params, enable_history)
        self.state = RunnerState()
        self._reporting: Optional[threading.Event] = None
        if report is not None and report_interval > 0:
            self._reporting = start_reporting(self.state, report, report_interval)
        self.max_retry_times = max_retry_times
        self.auxiliary_engines = list(auxiliary_engines or [])
        # Resettable workflows not in use, by class, reused across tasks. A task takes one out
        # for its attempt, so two tasks running at once (threads or coroutines) never share one.
        self._idle: Dict[type, List[Workflow]] = {}
        self._idle_lock = threading.Lock()

    def close(self) -> None:
        """Stop reporting this runner's state (a runner in this process that is given up)."""
        if self._reporting is not None:
            self._reporting.set()

    def _checkout(self, task: Task) -> Workflow:
        """A workflow for ``task``: an idle one reset to it, or a new one."""
        with self._idle_lock:
            idle = self._idle.get(task.workflow_cls)
            cached = idle.pop() if idle else None
        if cached is not None:
            # Calls the previous task recorded and never extracted are not this task's.
            if isinstance(getattr(cached, "model", None), ModelWrapper):
                cached.model.clear_history()
            cached.reset(task)
            return cached
        # Each workflow instance has its own wrapper: its recorded history and OpenAI clients
        # are those of the one task it runs at a time.
        return task.to_workflow(self.model.fork(), self._auxiliary_models())

    def _auxiliary_models(self) -> Optional[List]:
        """Fresh clients for a new workflow instance (an engine that restarted serves on a
        new port; each wrapper asks its engine where once)."""
        if not self.auxiliary_engines:
            return None
        return [ModelWrapper(engine).get_openai_client() for engine in self.auxiliary_engines]

    def _checkin(self, task: Task, workflow: Workflow) -> None:
        """Keep a workflow whose attempt succeeded for a later task (one that raised is dropped:
        never reuse a workflow left in a failed state)."""
        if workflow.resettable():
            with self._idle_lock:
                self._idle.setdefault(task.workflow_cls, []).append(workflow)

    def _attempts(self, task: Task, is_async: bool) -> Generator[Callable, Any, TaskResult]:
        """The retry loop of ``run_task`` and ``AsyncWorkflowRunner.run_task``.

        Yields what to call next: the workflow's ``run`` (``run_async`` if ``is_async``), then,
        if it made no model call, the engine's model version. The caller calls it (awaits it,
        if ``is_async``) and sends back what it returned, or throws in what it raised. Returns
        the task's result: experiences stamped with group and version, or the last error.
        """
        start = time.monotonic()
        result = TaskResult(task=task)
        outcome = None  # stays None when the caller gives up on the task (cancelled)
        try:
            yield from self._attempt_loop(task, is_async, result)
            outcome = result.error is None
        finally:
            self.state.end(id(result), outcome)
        result.seconds = time.monotonic() - start
        return result

    def _attempt_loop(self, task: Task, is_async: bool, result: TaskResult) -> Generator:
        """Up to ``max_retry_times + 1`` attempts of ``task``, filling ``result``."""
        for attempt in range(1, self.max_retry_times + 2):
            result.attempts = attempt
            self.state.attempt(id(result), task.task_id, attempt)
            try:
                workflow = self._checkout(task)
                with self.model.track_versions() as seen:
                    experiences = yield workflow.run_async if is_async else workflow.run
                if not isinstance(experiences, list) or not all(
                    isinstance(e, Experience) for e in experiences
                ):
                    raise TypeError(
                        f"{task.workflow_cls.__name__}.{'run_async' if is_async else 'run'}() "
                        f"must return a list of Experience, got {type(experiences).__name__}"
                    )
                # The oldest weights that sampled any of the task's replies (read from the
                # replies: no extra engine call); asked for only if the workflow made none.
                if seen:
                    version = min(seen)
                else:
                    version = yield self._version_call(is_async)
                for exp in experiences:
                    # a workflow's own group_id is a suffix: a second group of the task
                    exp.group_id = task.task_id + exp.group_id
                    exp.model_version = version
                self._checkin(task, workflow)
                result.experiences, result.error = experiences, None
                break
            except Exception:  # a workflow or reward fn that raises: retry, then report
                result.error = traceback.format_exc()

    def _version_call(self, is_async: bool) -> Callable:
        if is_async:
            return self.model.model_version_async
        return lambda: self.model.model_version

    def run_task(self, task: Task) -> TaskResult:
        """Run ``task`` in this thread, retrying up to ``max_retry_times`` times if it raises."""
        attempts = self._attempts(task, is_async=False)
        try:
            call = next(attempts)
            while True:
                try:
                    answer = call()
                except Exception as exc:
                    call = attempts.throw(exc)
                else:
                    call = attempts.send(answer)
        except StopIteration as done:
            return done.value
        finally:
            attempts.close()  # an interrupted attempt leaves its version tracking here


class AsyncWorkflowRunner(WorkflowRunner):
    """Runs tasks as coroutines (``concurrent_mode: asynchronous``): each ``run_task`` call
    awaits ``Workflow.run_async``, so many tasks share one event loop and thread.

    A workflow that only defines a blocking ``run`` runs in a worker thread; ``threads``
    of them at most run at once (asyncio's default would allow only cores + 4).
    """

    def __init__(self, *args: Any, threads: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads = threads
        self._threads_for: Optional[asyncio.AbstractEventLoop] = None

    async def run_task(self, task: Task) -> TaskResult:  # type: ignore[override]
        """Run ``task`` on the running loop, retrying up to ``max_retry_times`` times."""
        loop = asyncio.get_running_loop()
        if self._threads_for is not loop:
            loop.set_default_executor(ThreadPoolExecutor(max_workers=max(1, self.threads)))
            self._threads_for = loop
        attempts = self._attempts(task, is_async=True)
        try:
            call = next(attempts)
            while True:
                try:
                    answer = await call()
                except Exception as exc:
                    call = attempts.throw(exc)
                else:
                    call = attempts.send(answer)
        except StopIteration as done:
            return done.value
        finally:
            attempts.close()  # a cancelled task leaves its version tracking here
