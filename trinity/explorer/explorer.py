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
from typing import Any, Callable, Dict, List, Optional, Tuple

from trinity.algorithm import needs_groups
from trinity.buffer.pipelines import build_experience_pipeline
from trinity.buffer.task_reader import Feedback
from trinity.common.config.sync_checks import DYNAMIC_STYLES
from trinity.common.experience import Experience, grouped
from trinity.common.sync_schedule import Wanted, wanted_before
from trinity.common.workflows.workflow import Task
from trinity.explorer.fully_async import FullyAsync
from trinity.explorer.pool import RunnerPool
from trinity.explorer.pool_rules import min_tasks
from trinity.explorer.runner import TaskResult
from trinity.utils.status import Reporter

logger = logging.getLogger(__name__)


class Explorer:
    def __init__(
        self,
        config: Any,
        pool: RunnerPool,
        task_reader: Any,
        eval_readers: Dict[str, Any],
        sync: Callable[[Wanted], int],
        write: Optional[Callable[[List[Experience]], None]],
        log: Callable[[Dict[str, float], int], None],
        start_step: int = 0,
        report: Optional[Reporter] = None,
    ) -> None:
        """``sync(wanted)`` makes the engines hold the weights ``wanted`` (``synchronizer.py``)
        says and returns their version;
        ``write(experiences, step)`` sends a step's experiences to the trainer's buffer (once per
        step, even when empty: that closes the step); ``log`` records metrics; ``report``
        carries failures to the console."""
        self.config = config
        self.pool = pool
        self.task_reader = task_reader
        self.eval_readers = eval_readers
        self.sync = sync
        self.write = write
        self.log = log
        self.step = start_step
        self.version = start_step
        self.evaluated_version = start_step  # fixed: the version the last evaluation waited for
        self.report = report or Reporter(None, "explorer")
        # data_processor.experience_pipeline
        self.pipeline = build_experience_pipeline(config, needs_groups(config))

    def _expand(self, tasks: List[Task], step: Optional[int] = None) -> List[Task]:
        """Give each task its group id (named after ``step``, default the current one); split
        repeats per ``max_repeat_times_per_runner``."""
        limit = self.config.explorer.max_repeat_times_per_runner
        step = self.step if step is None else step
        out = []
        for task in tasks:
            kind = "eval" if task.is_eval else "train"
            task.task_id = f"{kind}-{step}-{task.taskset_name}-{task.index}"
            n = task.rollout_args.n
            chunk = limit if limit and not task.is_eval else n
            for start in range(0, n, chunk):
                args = task.rollout_args.model_copy(update={"n": min(chunk, n - start)})
                out.append(replace(task, rollout_args=args))
        return out

    def _run(self, tasks: List[Task], label: str, is_eval: bool = False) -> List[TaskResult]:
        """Run ``tasks``; report failures; fail the run as ``explorer.max_failed_ratio`` says.

        With ``explorer.over_rollout`` a training step's results include the tasks it left
        behind (``left_behind``: cancelled, no experiences, not failures).
        """
        over = self.config.explorer.over_rollout
        if is_eval or over.ratio <= 0:
            all_results = self.pool.run(self._expand(tasks), label)
        else:
            enough = min_tasks(len(tasks), over.ratio)
            expanded = self._expand(tasks)
            all_results = self.pool.run(expanded, label, enough, over.wait_after_min)
        return self._check_failures(all_results, label, is_eval)

    def _check_failures(
        self, all_results: List[TaskResult], label: str, is_eval: bool = False
    ) -> List[TaskResult]:
        """Log and report failed tasks; raise ``TaskFailures`` past ``max_failed_ratio``."""
        results = [r for r in all_results if not r.left_behind]
        failed = [r for r in results if r.error]
        if not failed:
            return all_results
        for r in failed:
            logger.error(
                "task %s failed after %d attempt(s):\n%s", r.task.task_id, r.attempts, r.error
            )
        first = failed[0]
        self.report.event(
            f"{label}: {len(failed)} of {len(results)} task(s) failed; e.g. {first.task.task_id} "
            f"after {first.attempts} attempt(s): {last_line(first.error)}"
        )
        ratio, limit = len(failed) / len(results), self.config.explorer.max_failed_ratio
        if len(failed) == len(results) or (not is_eval and ratio >= limit):
            raise TaskFailures(
                f"{label}: {len(failed)} of {len(results)} task(s) failed "
                f"(explorer.max_failed_ratio = {limit:g}); {first.task.task_id} after "
                f"{first.attempts} attempt(s): {last_line(first.error)}"
            )
        return all_results

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
            wanted_before(
                self.step,
                sync_cfg.sync_style,
                sync_cfg.sync_interval,
                sync_cfg.sync_offset,
                sync_cfg.max_staleness,
            )
        )
        waited, start = time.monotonic() - start, time.monotonic()
        results = self._run(tasks, f"explore step {self.step}")
        self.finish_step(self.step, results, self.version, time.monotonic() - start, waited)
        return True

    def finish_step(
        self, step: int, results: List[TaskResult], version: int, seconds: float, waited: float
    ) -> None:
        """Write explore step ``step``'s experiences (through the experience pipeline) and log
        its metrics; ``version``: the weights it was explored with (the oldest, if several)."""
        # before the write: the selector state saved with the step includes this step
        self.task_reader.feedback(task_feedback(results))
        experiences = grouped([e for r in results for e in r.experiences])
        metrics = rollout_metrics(experiences, prefix="rollout")  # what the model did
        if self.pipeline is not None:
            experiences, found = self.pipeline.run(experiences)
            metrics.update(found)
        metrics.update(
            {
                "rollout/tasks_failed": float(sum(1 for r in results if r.error)),
                "rollout/tasks_left_behind": float(sum(1 for r in results if r.left_behind)),
                "rollout/model_version": float(version),
                "time/explore_step": seconds,
                "time/wait_for_weights": waited,  # includes loading them into the engines
            }
        )
        # The row first: a run killed between the two resumes after the last step written and
        # drops the rows logged after it (``role_monitor``), so each step keeps one row; the
        # other order lost the row of a step written just before the kill.
        self.log(metrics, step)
        if self.write is not None:
            self.write(experiences, step)  # even when empty: it closes the step

    def evaluate(self, step: int, prefix: str = "eval") -> Dict[str, float]:
        """Run every eval taskset with the weights held now; log ``<prefix>/<taskset>/...``
        at ``step`` (bench mode: prefix ``bench``)."""
        metrics: Dict[str, float] = {}
        start = time.monotonic()
        for name, reader in self.eval_readers.items():
            tasks = reader.read_all()
            results = self._run(tasks, f"{prefix} of {name} at step {step}", is_eval=True)
            experiences = [e for r in results for e in r.experiences]
            metrics.update(rollout_metrics(experiences, prefix=f"{prefix}/{name}"))
        if metrics:
            metrics[f"time/{prefix}"] = time.monotonic() - start
            self.log(metrics, step)
        return metrics

    def run(self) -> int:
        """Explore until done; returns the last step explored."""
        cfg = self.config.explorer
        if cfg.eval_on_startup and self.step == 0:
            self.evaluate(0)
        dynamic = self.config.synchronizer.sync_style in DYNAMIC_STYLES
        last = self.config.buffer.total_steps
        if self.config.synchronizer.sync_style == "fully_async":
            FullyAsync(self).run()
        else:
            while self.explore_step():
                due = cfg.eval_interval and self.step % cfg.eval_interval == 0
                if due and not (dynamic and self.step == last):  # that one waits for the end
                    self._eval_after_update(self.step)
        evaluated = cfg.eval_interval and self.step % cfg.eval_interval == 0
        if dynamic or not evaluated or self.evaluated_version < self.step:  # final weights, once
            self._eval_after_update(self.step, final=True)
        return self.step

    def _eval_after_update(self, step: int, final: bool = False) -> None:
        """Evaluate at explore step ``step``. ``fixed``: the weights of trainer step ``step``
        (waits for the trainer if behind); between two syncs, the newest the trainer published
        (it publishes every ``sync_interval`` steps and at its end: waiting for ``step``
        itself would wait for an update that waits for this explorer). Dynamic styles: the
        newest weights, and after the last step the trainer's final ones (it trains on what
        is left first)."""
        if not self.eval_readers or step <= 0:
            return
        if self.config.synchronizer.sync_style not in DYNAMIC_STYLES:
            every, last = self.config.synchronizer.sync_interval, self.config.buffer.total_steps
            self.evaluated_version = step if final or step == last else step - step % every
            self.version = self.sync(Wanted(self.evaluated_version))
        else:
            self.version = self.sync(Wanted(None, final=True) if final else Wanted(0))
        self.evaluate(step)


class TaskFailures(RuntimeError):
    """More of a step's tasks failed than ``explorer.max_failed_ratio`` allows."""


def last_line(error: str) -> str:
    """The last non-empty line of a traceback: the exception and its message."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else error


def task_feedback(results: List[TaskResult]) -> Dict[str, Feedback]:
    """Per taskset, ``(row indices, mean rewards, rollouts)`` of the tasks whose rollouts
    finished with rewards (failed and left-behind ones say nothing about the task). A task
    split over runners (``max_repeat_times_per_runner``) is one entry: the mean over all its
    experiences, and the rollouts of all its pieces."""
    rewards: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    rollouts: Dict[Tuple[str, int], int] = defaultdict(int)
    for r in results:
        scored = [float(e.reward) for e in r.experiences if e.reward is not None]
        if r.error or r.left_behind or not scored:
            continue
        key = (r.task.taskset_name, r.task.index)
        rewards[key] += scored
        rollouts[key] += r.task.rollout_args.n
    out: Dict[str, Feedback] = {}
    for (taskset, index), values in rewards.items():
        indices, means, counts = out.setdefault(taskset, ([], [], []))
        indices.append(index)
        means.append(sum(values) / len(values))
        counts.append(rollouts[(taskset, index)])
    return out


def rollout_metrics(experiences: List[Experience], prefix: str) -> Dict[str, float]:
    """Mean/max/min of reward, response length, every reward component (accuracy, format...)
    and ``logprob``: a response's mean logprob per generated token under the weights that
    sampled it (it moves with the weights even where rewards do not)."""
    if not experiences:
        return {}
    series: Dict[str, List[float]] = defaultdict(list)
    for e in experiences:
        series["reward"].append(float(e.reward or 0.0))
        series["response_length"].append(float(e.response_length))
        if e.logprobs is not None and bool(e.action_mask.any()):
            series["logprob"].append(float(e.logprobs[e.action_mask].mean()))
        for k, v in e.metrics.items():
            series[k].append(float(v))
    out = {}
    for key, values in series.items():
        out[f"{prefix}/{key}/mean"] = sum(values) / len(values)
        out[f"{prefix}/{key}/max"] = max(values)
        out[f"{prefix}/{key}/min"] = min(values)
    return out
