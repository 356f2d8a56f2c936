"""The one place components become Ray actors (DESIGN.md §2.2).

Each actor sets up its process first (plugins, a log file under ``<job_dir>/log/``, torch
threads), then builds the plain component it hosts.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Dict, List, Optional, Tuple

import ray

from trinity.common.workflows.workflow import Task
from trinity.explorer.pool_rules import DynamicTimeout, OverRollout
from trinity.explorer.runner import AsyncWorkflowRunner, TaskResult, WorkflowRunner
from trinity.runtime.roles import setup_process
from trinity.runtime.status import Reporter, RunStatus
from trinity.runtime.trainer_role import TrainerRole

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
class RunnerActor(WorkflowRunner):
    """A threaded actor: ``max_concurrency`` tasks at once, one per thread."""

    def __init__(
        self,
        plugin_dirs: List[str],
        job_dir: str,
        name: str,
        level: str,
        by_node: bool = False,
        **kwargs: Any,
    ) -> None:
        setup_process(plugin_dirs, job_dir, name, level, by_node=by_node)
        super().__init__(**kwargs)


@ray.remote(num_cpus=0)
class AsyncRunnerActor(AsyncWorkflowRunner):
    """An async actor (``concurrent_mode: asynchronous``): ``max_concurrency`` tasks at once,
    as coroutines on its one event loop."""

    def __init__(
        self,
        plugin_dirs: List[str],
        job_dir: str,
        name: str,
        level: str,
        by_node: bool = False,
        **kwargs: Any,
    ) -> None:
        setup_process(plugin_dirs, job_dir, name, level, by_node=by_node)
        super().__init__(**kwargs)


# A rollout engine that dies is restarted this many times (with its initial weights: the
# explorer reloads the current ones before the next step); calls in flight are retried.
ENGINE_RESTARTS = 3


@ray.remote(num_cpus=0, max_restarts=ENGINE_RESTARTS, max_task_retries=2)
class EngineActor:
    """Hosts a ``TransformersInferenceModel`` (async methods: requests are batched), and with
    ``openai_api`` (``{"host", "port"}``) its OpenAI-compatible server."""

    def __init__(
        self,
        job_dir: str,
        name: str,
        level: str,
        threads: int,
        openai_api: Optional[Dict[str, Any]] = None,
        by_node: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        setup_process([], job_dir, name, level, threads=threads, by_node=by_node)
        from trinity.common.models.transformers_model import TransformersInferenceModel

        self.model = TransformersInferenceModel(num_threads=threads, **engine_kwargs)
        self.api: Optional[Dict[str, str]] = None
        if openai_api is not None:
            self.api = self._serve(openai_api["host"], openai_api["port"], engine_kwargs)

    def _serve(self, host: str, port: int, engine_kwargs: Dict[str, Any]) -> Dict[str, str]:
        """Start the server as a task on this actor's event loop (an async actor's
        ``__init__`` runs on it), so HTTP requests reach the same batching as ``chat``.
        A restarted engine serves again, on a new port when ``port`` is 0."""
        from trinity.engine.server import RunningServer, ServedModel, build_app

        model_path = engine_kwargs["model_path"]
        app = build_app(ServedModel.from_transformers(self.model, model_path))
        try:
            self.server = RunningServer(app, host, port)
        except OSError as exc:
            raise OSError(
                f"explorer.rollout_model.openai_api_host/openai_api_port: cannot listen on "
                f"{host}:{port} ({exc.strerror}); use a free port, or 0 for any free one"
            ) from exc
        url = self.server.url
        if self.server.host in ("0.0.0.0", "::"):  # every interface: clients use the node's IP
            url = f"http://{ray.util.get_node_ip_address()}:{self.server.port}"
        logger.info("OpenAI-compatible API of %s at %s/v1", model_path, url)
        return {"url": url, "model": model_path}

    async def api_address(self) -> Optional[Dict[str, str]]:
        """``{"url", "model"}`` of the OpenAI-compatible server, or None when it is off."""
        if self.api is not None and self.server.task.done():  # uvicorn failed or stopped
            raise RuntimeError(
                f"the OpenAI-compatible server at {self.api['url']} has stopped; see this "
                "engine's log for why"
            )
        return self.api

    async def chat(
        self, messages: List[Dict], params: Any, tools: Any = None, session: Any = None
    ) -> Any:
        return await self.model.chat(messages, params, tools, session)

    async def generate(self, prompt: str, params: Any) -> Any:
        return await self.model.generate(prompt, params)

    async def generate_ids(self, prompt_ids: List[int], params: Any) -> Any:
        return await self.model.generate_ids(prompt_ids, params)

    async def load_weights(self, weights: Any, version: int) -> None:
        await self.model.load_weights(weights, version)

    async def model_version(self) -> int:
        return await self.model.model_version()


@ray.remote(num_cpus=0, max_concurrency=8)
class QueueActor:
    """The experience queue shared by explorer (put) and trainer (get), persisted in table
    ``table`` of ``database`` (a SQLite file or any SQLAlchemy URL)."""

    def __init__(
        self,
        database: Optional[str],
        table: str = "experiences",
        rewind_to: Optional[int] = None,
        replay: Any = None,
        follow: bool = False,
    ) -> None:
        """``replay``: the ``ReplayBufferConfig`` when replay is on, else None. ``follow``:
        another process (an ``explore`` run) writes the store; poll it (a ``train`` run)."""
        from trinity.buffer import ExperienceQueue, SQLExperienceStore
        from trinity.buffer.store_follower import StoreFollower

        store = SQLExperienceStore(database, table) if database else None
        if follow and store is not None:
            self.follower = StoreFollower(store, rewind_to)
            self.queue = self.follower.queue
        else:
            self.queue = ExperienceQueue(store=store, rewind_to=rewind_to, replay=replay)

    def put(self, exps: List[Any], step: int) -> None:
        self.queue.put(exps, step)

    def get(self, n: int, **kwargs: Any) -> Any:
        """``ExperienceQueue.get``: a ``ReadResult``."""
        return self.queue.get(n, **kwargs)

    def last_step(self) -> int:
        return self.queue.last_step()

    def close(self) -> None:
        self.queue.close()

    def size(self) -> int:
        return self.queue.size()

    def set_explorer_finished(self, finished: bool) -> None:
        """The end mark a decoupled ``train`` run stops at (``store_follower.py``)."""
        if self.queue.store is not None:
            self.queue.store.set_explorer_finished(finished)


StatusActor = ray.remote(num_cpus=0)(RunStatus)
# The trainer (rank 0) of a stage that runs on Ray; local_stage.py runs a TrainerRole in-process.
TrainerActor = ray.remote(num_cpus=0)(TrainerRole)


class RayRunnerPool:
    """Runs tasks on a pool of ``RunnerActor``s with ``explorer.max_timeout`` per task (or
    the limit of ``timeout``, a ``DynamicTimeout``: ``explorer.dynamic_timeout``).

    Each runner holds at most ``rows`` samples' worth of tasks at once (a task asks for
    ``rollout_args.n``; always at least one task, so ``rows=1`` is sequential): a training
    step's 8-sample tasks go a few at a time, one-sample eval tasks many at a time, so the
    engine sees similar batches for both. A runner that times out or dies is killed and
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
        make_runner: Any,
        size: int,
        max_timeout: float,
        rows: int = 1,
        max_retry_times: int = 0,
        report: Optional[Reporter] = None,
        timeout: Optional[DynamicTimeout] = None,
    ) -> None:
        self.make_runner = make_runner
        self.runners = [make_runner(i) for i in range(size)]
        self.max_timeout = max_timeout
        self.timeout = timeout or DynamicTimeout(max_timeout)
        self.rows = rows
        self.max_retry_times = max_retry_times
        self.report = report
        # A task's time limit starts when it is sent, so runners must be up before that.
        ray.get([runner.__ray_ready__.remote() for runner in self.runners])

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
        todo, per_runner = deque(tasks), self._tasks_per_runner(tasks)
        free = [runner for runner in self.runners for _ in range(per_runner)]
        pending: Dict[Any, tuple] = {}  # ref -> (task, runner, started: monotonic)
        lost: Dict[int, int] = {}  # id(task) -> attempts lost to timeouts and dead runners
        results: List[TaskResult] = []
        cutoff = None if enough is None else OverRollout(tasks, enough, wait_after_min)
        while todo or pending:
            while todo and free:
                runner, task = free.pop(), todo.popleft()
                pending[runner.run_task.remote(task)] = (task, runner, time.monotonic())
            # Wake at the next deadline at the latest, so a timeout is noticed on time. A
            # limit follows the successes so far: a task sent before any is cut once they come.
            first = min(t0 + self.timeout.limit(task) for task, _, t0 in pending.values())
            left = cutoff.seconds_left() if cutoff is not None else None
            wait = min(1.0, first - time.monotonic(), 1.0 if left is None else left)
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.01, wait))
            ended = [self._collect(ref, pending, lost, todo, free, per_runner) for ref in done]
            now = time.monotonic()
            for ref, (task, runner, started) in list(pending.items()):
                if ref in pending and now - started > self.timeout.limit(task):
                    pending.pop(ref)
                    msg = f"timed out after {self.timeout.describe(task)}"
                    ended.append((task, self._lost(task, msg, lost, todo)))
                    self._restart(runner, pending, todo, free, per_runner)
            for task, result in ended:
                if result is not None:  # None: the task goes again
                    results.append(result)
                    if cutoff is not None:
                        cutoff.finish(task)
            if cutoff is not None and cutoff.expired() and (todo or pending):
                results += self._leave_behind(label, todo, pending)
            self._report(pending, label)
        if self.report is not None:
            self.report.done()
        return results

    def _collect(
        self, ref: Any, pending: Dict, lost: Dict[int, int], todo: deque, free: List, per: int
    ) -> Tuple[Task, Optional[TaskResult]]:
        """(task as sent, its result; None when the task goes again). A success's time
        feeds the dynamic timeout."""
        task, runner, started = pending.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            gave_up = self._lost(task, f"its workflow runner died: {exc}", lost, todo)
            self._restart(runner, pending, todo, free, per)
            return task, gave_up
        free.append(runner)
        if result.error is None:
            self.timeout.record(task, time.monotonic() - started)
        return task, result

    def _leave_behind(self, label: str, todo: deque, pending: Dict) -> List[TaskResult]:
        """over_rollout: the step goes on. Tasks still running are cancelled (their runners
        killed and replaced: a running workflow cannot be stopped otherwise), tasks not
        started are dropped; all come back as ``left_behind`` results."""
        behind = [task for task, _, _ in pending.values()] + list(todo)
        busy = list({id(runner): runner for _, runner, _ in pending.values()}.values())
        pending.clear()
        todo.clear()
        for runner in busy:
            ray.kill(runner, no_restart=True)
        indexes = [self.runners.index(runner) for runner in busy]
        for index in indexes:
            self.runners[index] = self.make_runner(index)
        ray.get([self.runners[index].__ray_ready__.remote() for index in indexes])
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

    def _report(self, pending: Dict[Any, tuple], label: str) -> None:
        if self.report is None or not pending:
            return
        task, _, started = min(pending.values(), key=lambda item: item[2])
        age = time.monotonic() - started
        if age > self.REPORT_AFTER_S:
            self.report.wait(
                f"{len(pending)} task(s) of {label} to finish; the oldest, {task.task_id}, may "
                f"run {self.timeout.describe(task)}",
                since=time.time() - age,
            )

    def _restart(
        self, runner: Any, pending: Dict[Any, tuple], todo: deque, free: List, per_runner: int
    ) -> None:
        """Replace ``runner``; the tasks it still held go back to the front of the queue."""
        for ref, (task, owner, _) in list(pending.items()):
            if owner is runner:
                pending.pop(ref)
                todo.appendleft(task)
        free[:] = [r for r in free if r is not runner]
        index = self.runners.index(runner)
        ray.kill(runner, no_restart=True)
        self.runners[index] = self.make_runner(index)
        ray.get(self.runners[index].__ray_ready__.remote())
        free.extend([self.runners[index]] * per_runner)
