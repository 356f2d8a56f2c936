"""The weight-sync schedule both roles follow (``synchronizer.sync_style``, ``sync_interval``,
``sync_offset``): which weights the explorer needs before a step, and which explore steps a
train step may wait for. Pure arithmetic on the config's values: the explorer, the trainer's
queue reader and the synchronizer (``trinity/runtime/synchronizer.py``) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trinity.common.config.sync_checks import DYNAMIC_STYLES


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


@dataclass(frozen=True)
class Wanted:
    """What the explorer needs from the synchronizer before a step or an evaluation."""

    version: Optional[int]  # load the newest weights once they are >= this; None: keep
    ask: bool = False  # explorer_driven: ask the trainer to publish at its next step end
    final: bool = False  # the trainer's last weights: wait until it has finished


def staleness_floor(step: int, max_staleness: Optional[int]) -> int:
    """The oldest weights explore step ``step`` may sample with so that train step ``step``,
    which reads it (one explore step per train step), keeps its experiences under
    ``synchronizer.max_staleness`` (None: no bound, 0)."""
    return 0 if max_staleness is None else max(0, step - 1 - max_staleness)


def wanted_before(
    step: int,
    style: str,
    sync_interval: int,
    sync_offset: int,
    max_staleness: Optional[int] = None,
) -> Wanted:
    """What the explorer loads before exploring ``step`` (1-based) in ``style``.

    ``fixed`` waits for ``required_version``. The dynamic styles load the newest published
    weights (version 0 is always there) once the first ``sync_offset`` steps ran on the
    starting weights, and wait only where older weights would make the step's experiences
    too stale to train on (``staleness_floor``): they would be sampled only to be dropped.
    ``explorer_driven`` also asks the trainer for fresh weights after every
    ``sync_interval`` steps from there; the trainer publishes at the end of its current step
    and the explorer loads them at its next step boundary (a floor not published yet is
    asked for too: ``Synchronizer.need``).
    """
    if style == "fixed":
        return Wanted(required_version(step, sync_interval, sync_offset))
    if step <= sync_offset:
        return Wanted(None)
    since = step - 1 - sync_offset
    ask = style == "explorer_driven" and since > 0 and since % sync_interval == 0
    return Wanted(staleness_floor(step, max_staleness), ask=ask)


def readable_bound(style: str, sync_interval: int, sync_offset: int) -> Any:
    """``train_step -> newest explore step it may wait for`` (None: any step).

    In the dynamic styles the explorer never waits for the trainer, so every explore step
    will be written: a train step may wait for any of them (the oldest come first).
    """
    if style in DYNAMIC_STYLES:
        return lambda train_step: None
    return lambda train_step: last_readable_step(train_step, sync_interval, sync_offset)
