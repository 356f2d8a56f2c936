"""Hands weights from the trainer to the explorer (docs/concepts/index.md, "Synchronizer").

``memory``: the trainer puts its state dict in the Ray object store and publishes the ref.
``checkpoint``: the trainer publishes the path of a saved checkpoint; when no trainer runs
in this job (``explore`` mode), the synchronizer reads the newest checkpoint on disk.
``nccl``: the trainer publishes a ``TransferOffer`` and waits in its broadcast until the
engines join (``common/weight_transfer.py``), so the explorer takes every version published
(``have``), also while it waits for a later one.
Every wait has a timeout and says which side did not arrive.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, List, Optional, Tuple

from trinity.common.weights import latest_step, weights_path


async def _wait(cond: asyncio.Condition, predicate: Any, timeout: float) -> bool:
    """Whether ``predicate`` held within ``timeout`` (``cond`` held). Checked first: Python
    3.11's ``asyncio.wait_for`` times out at once with a timeout of 0, even when ready."""
    if predicate():
        return True
    try:
        await asyncio.wait_for(cond.wait_for(predicate), timeout)
    except asyncio.TimeoutError:
        return False
    return True


class Synchronizer:
    def __init__(self, method: str, job_dir: str, timeout: float, has_trainer: bool) -> None:
        self.method = method
        self.job_dir = job_dir
        self.timeout = timeout
        self.has_trainer = has_trainer
        self.version = 0
        self._weights: Optional[List[Any]] = None  # [ObjectRef] (memory) or [path] (checkpoint)
        self._trainer_state = "running"  # running | finished | failed: <message>
        self._asked = False  # explorer_driven: the explorer asked for fresh weights
        self._needed = 0  # explorer_driven: the version the explorer waits for (0: none)
        self._changed: Optional[asyncio.Condition] = None

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def publish(self, version: int, weights: List[Any]) -> None:
        """Trainer side: weights of ``version`` are ready (a list keeps Ray refs unresolved)."""
        async with self._cond():
            self.version, self._weights = version, weights
            self._cond().notify_all()

    async def trainer_finished(self, error: Optional[str] = None) -> None:
        async with self._cond():
            self._trainer_state = f"failed: {error}" if error else "finished"
            self._cond().notify_all()

    def _from_disk(self, at_least: int) -> Optional[Tuple[int, List[Any]]]:
        step = latest_step(self.job_dir)
        if (
            step is not None
            and step >= at_least
            and os.path.exists(weights_path(self.job_dir, step))
        ):
            return step, [weights_path(self.job_dir, step)]
        return None

    async def wait_for(
        self, version: int, timeout: float, have: Optional[int] = None
    ) -> Optional[Tuple[int, List[Any]]]:
        """Explorer side: (version, weights) of at least ``version``, or with ``have`` (the
        version the engines hold) of any version newer than that; None after ``timeout``.

        The caller waits in short slices so it can say what it waits for, and builds the
        error when its whole ``sync_timeout`` has passed. Raises if the trainer failed.
        """
        if not self.has_trainer:
            return await self._poll_disk(version, timeout)
        async with self._cond():
            ready = lambda: self.version >= version or self._ended() or self._newer(have)  # noqa: E731
            if not await _wait(self._cond(), ready, timeout):
                return None
            if self._trainer_state.startswith("failed") and self.version < version:
                raise RuntimeError(
                    f"the trainer stopped before version {version}: {self._trainer_state}"
                )
            return self.version, self._weights or []

    async def wait_finished(
        self, timeout: float, have: Optional[int] = None
    ) -> Optional[Tuple[int, List[Any]]]:
        """Explorer side: the trainer's last (version, weights) once it finished, or with
        ``have`` any version newer than that before; None after ``timeout``. Raises if the
        trainer failed."""
        async with self._cond():
            done = lambda: self._ended() or self._newer(have)  # noqa: E731
            if not await _wait(self._cond(), done, timeout):
                return None
            if self._trainer_state.startswith("failed"):
                raise RuntimeError(f"the trainer stopped before its end: {self._trainer_state}")
            return self.version, self._weights or []

    def _ended(self) -> bool:
        return self._trainer_state != "running"

    def _newer(self, have: Optional[int]) -> bool:
        """Whether a version newer than ``have`` (None: never) is published."""
        return have is not None and self.version > have

    async def ask(self) -> None:
        """Explorer side (``explorer_driven``): publish fresh weights at your next step end."""
        self._asked = True

    async def need(self, version: int) -> None:
        """Explorer side (``explorer_driven``): it waits for ``version``
        (``synchronizer.max_staleness``), to be published at the end of the train step that
        reaches it; nothing when it is published already."""
        if version > self.version:
            self._needed = max(self._needed, version)

    async def take_ask(self, step: int) -> bool:
        """Trainer side (``explorer_driven``): whether to publish at the end of train step
        ``step``: the explorer asked since the last publish, or waits for this version
        (and clear what is answered)."""
        due = self._asked or 0 < self._needed <= step
        if due:
            self._asked = False
            self._needed = 0 if self._needed <= step else self._needed
        return due

    async def _poll_disk(self, version: int, timeout: float) -> Optional[Tuple[int, List[Any]]]:
        deadline = time.monotonic() + timeout
        while (found := self._from_disk(version)) is None:
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return found

    async def published(self) -> int:
        """The newest version the trainer published (or found on disk)."""
        return self.version

    async def trainer_state(self) -> str:
        return self._trainer_state
