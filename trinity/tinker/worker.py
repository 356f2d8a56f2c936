"""The one thread that runs the models: training work in arrival order, sampling batched.

Requests return futures at once; their work runs here, one job at a time, so the shared
base model, its adapters and the sampling engine are never used by two threads. Before each
training job the worker takes every sampling job waiting and runs them together (the
sampler batches them per set of weights): samples come from saved, immutable weights, so
running them ahead of queued training work changes no result.

A job's ``TinkerError`` fails its future with that error (a user error, the message naming
the field); any other exception is logged with its traceback and fails the future as a
server error.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional

from trinity.tinker.errors import TinkerError
from trinity.tinker.futures import Future, FutureStore

logger = logging.getLogger(__name__)

# How long the worker waits for more sampling requests once one arrives (none queued else).
GATHER_S = 0.05


@dataclass
class Job:
    future: Optional[Future]  # None: work nobody waits for (unloading a finished session's)
    run: Callable[[], Any]


@dataclass
class SampleJob:
    future: Future
    request: Any  # what the sampler's ``run_batch`` takes


class Worker:
    """``submit`` training jobs, ``submit_sample`` sampling jobs; ``close`` stops it."""

    def __init__(self, futures: FutureStore, run_samples: Callable[[List[SampleJob]], None]):
        self.futures, self.run_samples = futures, run_samples
        self._jobs: Deque[Job] = collections.deque()
        self._samples: List[SampleJob] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="tinker-worker", daemon=True)
        self._thread.start()

    def submit(self, future: Optional[Future], run: Callable[[], Any]) -> None:
        with self._cond:
            self._jobs.append(Job(future, run))
            self._cond.notify()

    def submit_sample(self, future: Future, request: Any) -> None:
        with self._cond:
            self._samples.append(SampleJob(future, request))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=60)

    def _next(self) -> tuple:
        with self._cond:
            while not (self._closed or self._jobs or self._samples):
                self._cond.wait()
            if self._closed:
                return None, None
            if self._samples and not self._jobs:
                # a client sends a batch of samples as separate requests, a few ms apart:
                # wait for the rest, so they are sampled together, not the first one alone
                deadline = time.monotonic() + GATHER_S
                while not self._closed and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            samples, self._samples = self._samples, []
            job: Optional[Job] = self._jobs.popleft() if self._jobs else None
            return samples, job

    def _loop(self) -> None:
        while True:
            samples, job = self._next()
            if samples is None:
                return
            if samples:
                start = time.perf_counter()
                self._guarded(lambda s=samples: self.run_samples(s), [j.future for j in samples])
                logger.info("%d Sample requests: %.2f s", len(samples), time.perf_counter() - start)
            if job is not None:
                start = time.perf_counter()
                self._guarded(lambda j=job: self._run(j), [job.future] if job.future else [])
                kind = job.future.kind if job.future else "Unload"
                logger.info("%s: %.2f s", kind, time.perf_counter() - start)

    def _run(self, job: Job) -> None:
        result = job.run()
        if job.future is not None:
            self.futures.complete(job.future, result)

    def _guarded(self, work: Callable[[], None], futures: List[Future]) -> None:
        """Run ``work``; if it raises, fail those of ``futures`` it left pending."""
        try:
            work()
        except TinkerError as exc:
            self._fail(futures, exc)
        except Exception as exc:  # the server's own failure: log it whole
            logger.exception("%s failed", futures[0].kind if futures else "work")
            self._fail(futures, TinkerError(500, f"{type(exc).__name__}: {exc}", category="server"))

    def _fail(self, futures: List[Future], error: TinkerError) -> None:
        for future in futures:
            if not future.done.is_set() and future.result is None and future.error is None:
                self.futures.fail(future, error)
