"""The one place components become Ray actors (DESIGN.md §2.2).

Each actor sets up its process first (plugins, a log file under ``<job_dir>/log/``, torch
threads), then builds the plain component it hosts.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Dict, List, Optional

import ray

from trinity.common.workflows.workflow import Task
from trinity.explorer.runner import TaskResult, WorkflowRunner


def setup_process(
    plugin_dirs: List[str], job_dir: str, actor_name: str, level: str = "INFO", threads: int = 1
) -> None:
    """Plugins, logging to ``<job_dir>/log/<actor_name>.log``, and ``threads`` torch threads.

    Compute actors split the cores between them: on a small machine, two processes each
    running all-core OpenMP loops spin against each other and slow down many times over.
    """
    from trinity.utils.plugin_loader import load_plugins

    load_plugins(plugin_dirs)
    log_dir = os.path.join(job_dir, "log")
    os.makedirs(log_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(log_dir, f"{actor_name}.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    import torch

    torch.set_num_threads(max(1, threads))


@ray.remote(num_cpus=0)
class RunnerActor(WorkflowRunner):
    def __init__(
        self, plugin_dirs: List[str], job_dir: str, name: str, level: str, **kwargs: Any
    ) -> None:
        setup_process(plugin_dirs, job_dir, name, level)
        super().__init__(**kwargs)


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts a ``TransformersInferenceModel`` (async methods: requests are batched)."""

    def __init__(
        self, job_dir: str, name: str, level: str, threads: int, **engine_kwargs: Any
    ) -> None:
        setup_process([], job_dir, name, level, threads=threads)
        from trinity.common.models.transformers_model import TransformersInferenceModel

        self.model = TransformersInferenceModel(num_threads=threads, **engine_kwargs)

    async def chat(self, messages: List[Dict], params: Any) -> Any:
        return await self.model.chat(messages, params)

    async def generate(self, prompt: str, params: Any) -> Any:
        return await self.model.generate(prompt, params)

    async def load_weights(self, weights: Any, version: int) -> None:
        await self.model.load_weights(weights, version)

    async def model_version(self) -> int:
        return await self.model.model_version()


@ray.remote(num_cpus=0, max_concurrency=8)
class QueueActor:
    """The experience queue shared by explorer (put) and trainer (get), persisted to SQLite."""

    def __init__(self, store_path: Optional[str], drop_unconsumed: bool = False) -> None:
        from trinity.buffer import ExperienceQueue, SQLiteExperienceStore

        store = SQLiteExperienceStore(store_path) if store_path else None
        self.queue = ExperienceQueue(store=store)
        self.dropped = self.queue.drop_all() if drop_unconsumed else 0

    def put(self, exps: List[Any]) -> None:
        self.queue.put(exps)

    def get(self, n: int, timeout: Optional[float]) -> Optional[List[Any]]:
        """Up to ``n`` experiences ([] if none came in time); None once closed and drained."""
        try:
            return self.queue.get(n, timeout)
        except StopIteration:
            return None

    def close(self) -> None:
        self.queue.close()

    def size(self) -> int:
        return self.queue.size()


def compute_threads(config: Any, role: str) -> int:
    """Torch threads for a compute actor of a stage: ``role`` is "engine" or "trainer".

    Actors that compute at the same time split the cores: two processes each running
    all-core OpenMP loops spin against each other and slow down many times over. With
    ``sync_offset: 0`` in a ``both`` run the engines and the trainer strictly alternate (the
    explorer waits for each update, the trainer for each batch), so each side gets every core
    while the other waits; otherwise they overlap and share.
    """
    cores = os.cpu_count() or 1
    engines = config.explorer.rollout_model.engine_num if config.mode != "train" else 0
    trainers = 1 if config.mode != "explore" else 0
    if config.mode == "both" and config.synchronizer.sync_offset == 0:
        return max(1, cores // engines) if role == "engine" else cores
    return max(1, cores // max(1, engines + trainers))


class RayRunnerPool:
    """Runs tasks on a pool of ``RunnerActor``s with ``explorer.max_timeout`` per task.

    Each runner holds at most ``rows`` samples' worth of tasks at once (a task asks for
    ``rollout_args.n``; always at least one task, so ``rows=1`` is sequential): a training
    step's 8-sample tasks go a few at a time, one-sample eval tasks many at a time, so the
    engine sees similar batches for both. A runner that times
    out or dies is killed and replaced, so one stuck workflow never stalls the step; its
    other in-flight tasks start again on the new runner.
    """

    def __init__(self, make_runner: Any, size: int, max_timeout: float, rows: int = 1) -> None:
        self.make_runner = make_runner
        self.runners = [make_runner(i) for i in range(size)]
        self.max_timeout = max_timeout
        self.rows = rows
        # A task's time limit starts when it is sent, so runners must be up before that.
        ray.get([runner.__ray_ready__.remote() for runner in self.runners])

    def _tasks_per_runner(self, tasks: List[Task]) -> int:
        n = max((task.rollout_args.n for task in tasks), default=1)
        return max(1, self.rows // max(1, n))

    def run(self, tasks: List[Task]) -> List[TaskResult]:
        todo, per_runner = deque(tasks), self._tasks_per_runner(tasks)
        free = [runner for runner in self.runners for _ in range(per_runner)]
        pending: Dict[Any, tuple] = {}
        results: List[TaskResult] = []
        while todo or pending:
            while todo and free:
                runner, task = free.pop(), todo.popleft()
                pending[runner.run_task.remote(task)] = (task, runner, time.monotonic())
            # Wake at the next deadline at the latest, so a timeout is noticed on time.
            deadline = min(started for _, _, started in pending.values()) + self.max_timeout
            wait = min(1.0, max(0.01, deadline - time.monotonic()))
            done, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
            for ref in done:
                task, runner, _ = pending.pop(ref)
                try:
                    results.append(ray.get(ref))
                    free.append(runner)
                except ray.exceptions.RayActorError as exc:
                    results.append(TaskResult(task=task, error=f"workflow runner died: {exc}"))
                    self._restart(runner, pending, todo, free, per_runner)
            now = time.monotonic()
            for ref, (task, runner, started) in list(pending.items()):
                if ref in pending and now - started > self.max_timeout:
                    pending.pop(ref)
                    msg = f"timed out after explorer.max_timeout={self.max_timeout}s"
                    results.append(TaskResult(task=task, error=msg))
                    self._restart(runner, pending, todo, free, per_runner)
        return results

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
