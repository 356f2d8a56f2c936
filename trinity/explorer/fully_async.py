"""``synchronizer.sync_style: fully_async``: explore steps overlap and weights change between
tasks, so no runner waits for a step's slowest task or for the trainer.

The explorer reads the next step's tasks whenever a runner has room. A step is written once
all its tasks are done, and steps are written in order: an explore step stays one batch of
the task reader, so a resumed run continues after the last written step exactly as in the
other styles (the tasks of later steps that were in flight are explored again). Before it
hands out a new step's tasks the explorer loads the newest published weights, never
waiting for them; each experience records the oldest version that sampled it (the runner's
``track_versions``), which is what the trainer's ``synchronizer.max_staleness`` reads.
An evaluation needs the runners: the steps before it finish first (they are written), then
it runs with the newest weights, then exploring goes on.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from trinity.common.sync_schedule import Wanted, staleness_floor, wanted_before
from trinity.common.workflows.workflow import Task
from trinity.explorer.runner import TaskResult

if TYPE_CHECKING:
    from trinity.explorer.explorer import Explorer


@dataclass
class OpenStep:
    """An explore step whose tasks are in flight."""

    tasks: int  # how many (split repeats counted) must come back
    started: float  # monotonic
    waited: float  # seconds spent loading weights before it was handed out
    results: List[TaskResult] = field(default_factory=list)


class FullyAsync:
    """Drives an ``Explorer`` in the fully_async style (see the module docstring)."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.open: Dict[int, OpenStep] = {}  # step -> its tasks, in reading order
        self.step_of: Dict[str, int] = {}  # task_id -> step
        self.read_step = explorer.step  # the last step whose tasks were read
        self.exhausted = False

    def run(self) -> None:
        """Explore to the end; an evaluation due at a step waits for the steps before it."""
        explorer, cfg = self.explorer, self.explorer.config
        interval, last = cfg.explorer.eval_interval, cfg.buffer.total_steps
        while not self.exhausted:
            stop = explorer.step + interval - explorer.step % interval if interval else None
            first = self._read(stop)
            if first:
                more = functools.partial(self._more, stop)
                explorer.pool.stream(first, more, self._collect, "fully_async exploring")
            if self.exhausted or stop is None or explorer.step != stop or stop == last:
                continue  # the last step's evaluation waits for the trainer's final weights
            explorer._eval_after_update(stop)

    def _more(self, stop: Optional[int], slots: int) -> List[Task]:
        """``RunnerPool.stream``'s refill: a step's tasks once any slot is free."""
        return self._read(stop)

    def _read(self, stop: Optional[int]) -> List[Task]:
        """The next step's tasks (none past ``stop`` or the end), after loading the newest
        weights."""
        explorer = self.explorer
        total = explorer.config.buffer.total_steps
        if self.exhausted or (stop is not None and self.read_step >= stop):
            return []
        if total and self.read_step >= total:
            self.exhausted = True
            return []
        if self._too_stale(self.read_step + 1):
            return []
        try:
            tasks = explorer.task_reader.read(explorer.config.buffer.batch_size)
        except StopIteration:
            self.exhausted = True
            return []
        self.read_step += 1
        sync = explorer.config.synchronizer
        start = time.monotonic()
        want = wanted_before(
            self.read_step,
            sync.sync_style,
            sync.sync_interval,
            sync.sync_offset,
            sync.max_staleness,
        )
        explorer.version = explorer.sync(want)
        expanded = explorer._expand(tasks, self.read_step)
        now = time.monotonic()
        self.open[self.read_step] = OpenStep(len(expanded), now, now - start)
        self.step_of.update({task.task_id: self.read_step for task in expanded})
        return expanded

    def _too_stale(self, step: int) -> bool:
        """Whether ``step``'s tasks wait for newer weights (``synchronizer.max_staleness``)
        while earlier steps are in flight: it is asked again at the next free slot, so that
        those steps are still collected and written meanwhile; with none in flight, ``_read``
        waits in ``explorer.sync`` (said like every wait for the trainer)."""
        explorer = self.explorer
        floor = staleness_floor(step, explorer.config.synchronizer.max_staleness)
        if not self.open or floor <= explorer.version:
            return False
        explorer.version = explorer.sync(Wanted(0))  # the newest published, never waiting
        if explorer.version >= floor:
            explorer.report.done()
            return False
        explorer.report.wait(
            f"the trainer to publish model version {floor} before explore step {step} "
            f"(synchronizer.max_staleness = {explorer.config.synchronizer.max_staleness})"
        )
        return True

    def _collect(self, result: TaskResult) -> None:
        """Keep ``result``; write every step that is complete and has no open step before it."""
        self.open[self.step_of[result.task.task_id]].results.append(result)
        while self.open:
            step = next(iter(self.open))
            done = self.open[step]
            if len(done.results) < done.tasks:
                return
            del self.open[step]
            explorer = self.explorer
            label = f"explore step {step}"
            results = explorer._check_failures(done.results, label)
            versions = [e.model_version for r in results for e in r.experiences]
            version = min(versions) if versions else explorer.version
            seconds = time.monotonic() - done.started
            explorer.step = step
            explorer.finish_step(step, results, version, seconds, done.waited)
