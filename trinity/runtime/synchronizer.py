"""Hands weights from the trainer to the explorer (DESIGN.md §2.5).

``memory``: the trainer puts its state dict in the Ray object store and publishes the ref.
``checkpoint``: the trainer publishes the path of a saved checkpoint; when no trainer runs
in this job (``explore`` mode), the synchronizer reads the newest checkpoint on disk.
Every wait has a timeout and says which side did not arrive.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from trinity.trainer.checkpoint import latest_step, weights_path


def pack_state(state_dict: Dict[str, torch.Tensor]) -> Dict[str, Tuple[np.ndarray, str]]:
    """Weights as numpy views for the object store (``memory`` sync).

    Ray stores numpy arrays without pickling and hands them back as zero-copy views, where
    torch tensors are pickled and copied on both sides (measured: seconds vs milliseconds
    at 100M parameters). ``ray.put`` copies the views once, so later optimizer steps do not
    leak into a published version. bf16 travels bit-for-bit as int16.
    """
    packed = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        packed[name] = (raw.numpy(), str(t.dtype).removeprefix("torch."))
    return packed


def unpack_state(packed: Dict[str, Tuple[np.ndarray, str]]) -> Dict[str, torch.Tensor]:
    """Tensors over the arrays of ``pack_state`` (no copy; ``load_state_dict`` copies)."""
    out = {}
    with warnings.catch_warnings():  # object-store arrays are read-only; we only read them
        warnings.simplefilter("ignore", UserWarning)
        for name, (array, dtype) in packed.items():
            tensor = torch.from_numpy(array)
            out[name] = tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
    return out


class SyncTimeoutError(TimeoutError):
    """A side of a sync did not arrive within ``synchronizer.sync_timeout``."""


def required_version(step: int, sync_interval: int, sync_offset: int) -> int:
    """Model version the explorer must hold before exploring ``step`` (1-based), ``fixed`` style.

    The explorer runs ``sync_offset`` steps ahead and refreshes every ``sync_interval`` steps:
    interval 1, offset 0 is strictly on-policy (step s uses the weights after s-1 updates).
    """
    return max(0, ((step - 1 - sync_offset) // sync_interval) * sync_interval)


def last_readable_step(train_step: int, sync_interval: int, sync_offset: int) -> int:
    """The newest explore step whose experiences train step ``train_step`` may wait for.

    Explore step ``s`` can be explored before the trainer publishes version ``train_step``
    exactly when ``required_version(s) <= train_step - 1``; waiting for any later step would
    wait for an explorer that waits for this very update. Solving ``required_version`` for
    ``s``: ``floor((s - 1 - offset) / I) <= floor((t - 1) / I)``.
    """
    return ((train_step - 1) // sync_interval + 1) * sync_interval + sync_offset


class Synchronizer:
    def __init__(self, method: str, job_dir: str, timeout: float, has_trainer: bool) -> None:
        self.method = method
        self.job_dir = job_dir
        self.timeout = timeout
        self.has_trainer = has_trainer
        self.version = 0
        self._weights: Optional[List[Any]] = None  # [ObjectRef] (memory) or [path] (checkpoint)
        self._trainer_state = "running"  # running | finished | failed: <message>
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

    async def wait_for(self, version: int, timeout: float) -> Optional[Tuple[int, List[Any]]]:
        """Explorer side: (version, weights) of at least ``version``; None after ``timeout``.

        The caller waits in short slices so it can say what it waits for, and builds the
        error when its whole ``sync_timeout`` has passed. Raises if the trainer failed.
        """
        if not self.has_trainer:
            return await self._poll_disk(version, timeout)
        async with self._cond():
            ready = lambda: self.version >= version or self._trainer_state != "running"  # noqa: E731
            try:
                await asyncio.wait_for(self._cond().wait_for(ready), timeout)
            except asyncio.TimeoutError:
                return None
            if self._trainer_state.startswith("failed") and self.version < version:
                raise RuntimeError(
                    f"the trainer stopped before version {version}: {self._trainer_state}"
                )
            return self.version, self._weights or []

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
