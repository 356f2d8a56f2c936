"""The trainer's view of the experience queue (an actor, or in one process a ``QueueHost``):
reads that wait only for what will come."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional

from trinity.runtime.roles import WAIT_SLICE_S, call
from trinity.utils.status import Reporter

logger = logging.getLogger(__name__)


class ReadTimeoutError(TimeoutError):
    """No experience of a step the trainer waits for arrived within ``max_read_timeout``."""


class QueueReader:
    """The trainer's view of the queue: ``begin_step(t)``, then ``read(n)`` for step ``t``.

    A read takes experiences of the explore steps train step ``t`` may wait for
    (``max_step_of(t)``) and waits only while one of them is still being explored. When
    ``max_read_timeout`` passes, what arrived is trained on (the configuration guide's
    "incomplete batch"), said on the console; if nothing arrived, the trainer fails naming
    the step it waited for. A strategy's own shorter ``timeout`` just gets what is there.
    """

    def __init__(
        self,
        queue: Any,
        max_read_timeout: float,
        max_step_of: Any,
        whole_groups: bool = False,
        report: Optional[Reporter] = None,
        writer: str = "the explorer",
    ) -> None:
        """``writer``: who fills the queue, as waits name it."""
        self.queue, self.max_read_timeout, self.writer = queue, max_read_timeout, writer
        self.max_step_of, self.whole_groups = max_step_of, whole_groups
        self.report = report or Reporter(None, "trainer")
        self.step = 1

    def begin_step(self, step: int) -> None:
        self.step = step

    def read(self, batch_size: int, timeout: Optional[float] = None) -> List[Any]:
        limit = self.max_read_timeout if timeout is None else timeout
        start, since, max_step = time.monotonic(), time.time(), self.max_step_of(self.step)
        while True:
            left = max(0.0, limit - (time.monotonic() - start))
            final = left <= WAIT_SLICE_S
            result = call(
                self.queue,
                "get",
                batch_size,
                max_step=max_step,
                timeout=min(WAIT_SLICE_S, left),
                whole_groups=self.whole_groups,
                consumer=self.step,
                take_partial=final,
            )
            if result.state != "timeout" or final:
                break
            self.report.wait(self._waiting_for(result.waiting_for, limit), since=since)
        self.report.done()
        exps = result.experiences
        if result.state == "ended" and not exps:
            raise StopIteration("the explorer has finished and the queue is drained")
        if result.state == "timeout" and timeout is None:
            self._timed_out(exps, batch_size, result.waiting_for)
        return exps

    def _waiting_for(self, step: int, limit: float) -> str:
        """What a read waits for, as the console says it; with no limit (mode serve), rows
        of any step."""
        if math.isinf(limit):
            return f"{self.writer} (train step {self.step})"
        return (
            f"{self.writer} to finish step {step} "
            f"(buffer.trainer_input.experience_buffer.max_read_timeout={limit:g}s)"
        )

    def _timed_out(self, exps: List[Any], batch_size: int, waiting_for: int) -> None:
        where = (
            f"explore step {waiting_for} did not finish within "
            f"buffer.trainer_input.experience_buffer.max_read_timeout={self.max_read_timeout:g}s"
        )
        if not exps:
            raise ReadTimeoutError(f"{where}: no experience to train on; see the explorer's log")
        self.report.event(
            f"train step {self.step}: {where}; training on the {len(exps)} of {batch_size} "
            "experiences that arrived"
        )


class StaleFilter:
    """``synchronizer.max_staleness`` over a reader: whole groups sampled by weights more
    than ``bound`` versions older than the ones the train step updates are dropped (the
    reader reads on to fill the batch), and each step reports ``staleness/max``,
    ``staleness/mean`` (of what it kept) and ``staleness/dropped``."""

    def __init__(self, reader: Any, bound: int) -> None:
        self.reader, self.bound = reader, bound
        self.begin_step(1)

    def begin_step(self, step: int) -> None:
        if hasattr(self.reader, "begin_step"):
            self.reader.begin_step(step)
        self.step, self.dropped, self.ages = step, 0, []

    def read(self, batch_size: int, timeout: Optional[float] = None) -> List[Any]:
        from trinity.algorithm.sample_strategy.staleness import StaleOnly, read_fresh, staleness

        try:
            kept, dropped = read_fresh(self.reader, batch_size, self.step, self.bound, timeout)
        except StaleOnly as exc:
            self.dropped += exc.dropped
            logger.warning(
                "train step %d: the explorer finished and the %d experiences left were more "
                "than synchronizer.max_staleness = %d versions old: dropped",
                self.step,
                exc.dropped,
                self.bound,
            )
            raise StopIteration(str(exc)) from None
        self.dropped += dropped
        self.ages += [staleness(e, self.step) for e in kept]
        return kept

    def step_metrics(self) -> Dict[str, float]:
        """This step's staleness figures (versions between the sampling and updated weights)."""
        metrics = {"staleness/dropped": float(self.dropped)}
        if self.ages:
            metrics["staleness/max"] = float(max(self.ages))
            metrics["staleness/mean"] = sum(self.ages) / len(self.ages)
        return metrics
