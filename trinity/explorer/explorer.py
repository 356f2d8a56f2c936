"""Explorer: each step reads ``batch_size`` tasks, runs them, and writes their experiences.

Evaluation runs on ``eval_tasksets`` at step 0 (``eval_on_startup``), every ``eval_interval``
steps and after the last step, always with the weights of the trainer step it is labelled
with (so "eval at step s" means "the model after s updates" when syncing every step).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Protocol

from trinity.common.experience import Experience
from trinity.common.workflows.workflow import Task
from trinity.explorer.runner import TaskResult
from trinity.runtime.synchronizer import required_version

logger = logging.getLogger(__name__)


class RunnerPool(Protocol):
    def run(self, tasks: List[Task]) -> List[TaskResult]: ...


class Explorer:
    def __init__(
        self,
        config: Any,
        pool: RunnerPool,
        task_reader: Any,
        eval_readers: Dict[str, Any],
        sync: Callable[[int], int],
        write: Optional[Callable[[List[Experience]], None]],
        log: Callable[[Dict[str, float], int], None],
        start_step: int = 0,
    ) -> None:
        """``sync(version)`` makes the engines hold weights >= version and returns the version held;
        ``write`` sends experiences to the trainer's buffer; ``log`` records metrics."""
        self.config = config
        self.pool = pool
        self.task_reader = task_reader
        self.eval_readers = eval_readers
        self.sync = sync
        self.write = write
        self.log = log
        self.step = start_step
        self.version = start_step

    def _expand(self, tasks: List[Task]) -> List[Task]:
        """Give each task its group id; split repeats per ``max_repeat_times_per_runner``."""
        limit = self.config.explorer.max_repeat_times_per_runner
        out = []
        for task in tasks:
            kind = "eval" if task.is_eval else "train"
            task.task_id = f"{kind}-{self.step}-{task.taskset_name}-{task.index}"
            n = task.rollout_args.n
            chunk = limit if limit and not task.is_eval else n
            for start in range(0, n, chunk):
                args = task.rollout_args.model_copy(update={"n": min(chunk, n - start)})
                out.append(replace(task, rollout_args=args))
        return out

    def _run(self, tasks: List[Task]) -> List[TaskResult]:
        results = self.pool.run(self._expand(tasks))
        failed = [r for r in results if r.error]
        for r in failed[:3]:
            logger.error(
                "task %s failed after %d attempts:\n%s", r.task.task_id, r.attempts, r.error
            )
        if results and len(failed) == len(results):
            raise RuntimeError(
                f"every task of step {self.step} failed; the first error was:\n{failed[0].error}"
            )
        return results

    def explore_step(self) -> bool:
        """Explore one step; False when the taskset (or ``total_steps``) is exhausted."""
        total = self.config.buffer.total_steps
        if total and self.step >= total:
            return False
        try:
            tasks = self.task_reader.read(self.config.buffer.batch_size)
        except StopIteration:
            return False
        self.step += 1
        sync_cfg = self.config.synchronizer
        start = time.monotonic()
        self.version = self.sync(
            required_version(self.step, sync_cfg.sync_interval, sync_cfg.sync_offset)
        )
        waited, start = time.monotonic() - start, time.monotonic()
        results = self._run(tasks)
        experiences = [e for r in results for e in r.experiences]
        if self.write is not None:
            self.write(experiences)
        metrics = rollout_metrics(experiences, prefix="rollout")
        metrics.update(
            {
                "rollout/tasks_failed": float(sum(1 for r in results if r.error)),
                "rollout/model_version": float(self.version),
                "time/explore_step": time.monotonic() - start,
                "time/wait_for_weights": waited,  # includes loading them into the engines
            }
        )
        self.log(metrics, self.step)
        return True

    def evaluate(self, step: int) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        start = time.monotonic()
        for name, reader in self.eval_readers.items():
            tasks = reader.read_all()
            experiences = [e for r in self._run(tasks) for e in r.experiences]
            metrics.update(rollout_metrics(experiences, prefix=f"eval/{name}"))
        if metrics:
            metrics["time/eval"] = time.monotonic() - start
            self.log(metrics, step)
        return metrics

    def run(self) -> int:
        """Explore until done; returns the last step explored."""
        cfg = self.config.explorer
        if cfg.eval_on_startup and self.step == 0:
            self.evaluate(0)
        while self.explore_step():
            if cfg.eval_interval and self.step % cfg.eval_interval == 0:
                self._eval_after_update(self.step)
        if not (cfg.eval_interval and self.step % cfg.eval_interval == 0):
            self._eval_after_update(self.step)
        return self.step

    def _eval_after_update(self, step: int) -> None:
        """Evaluate the weights of trainer step ``step`` (waits for the trainer if behind)."""
        if self.eval_readers and step > 0:
            self.version = self.sync(step)
            self.evaluate(step)


def rollout_metrics(experiences: List[Experience], prefix: str) -> Dict[str, float]:
    """Mean/max/min of reward, response length and every reward component (accuracy, format...)."""
    if not experiences:
        return {}
    series: Dict[str, List[float]] = defaultdict(list)
    for e in experiences:
        series["reward"].append(float(e.reward or 0.0))
        series["response_length"].append(float(e.response_length))
        for k, v in e.metrics.items():
            series[k].append(float(v))
    out = {}
    for key, values in series.items():
        out[f"{prefix}/{key}/mean"] = sum(values) / len(values)
        out[f"{prefix}/{key}/max"] = max(values)
        out[f"{prefix}/{key}/min"] = min(values)
    return out
