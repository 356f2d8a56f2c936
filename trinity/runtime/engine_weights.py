"""How the explorer's rollout engines get the trainer's weights: the waits on the
synchronizer, each bounded by ``synchronizer.sync_timeout`` and saying what they wait for,
and the loads, which name an engine that did not load in time. ``ExplorerRole`` (and the
serve role) inherit it; ``ExplorerRole._sync`` decides what to load before each step.
"""

from __future__ import annotations

import logging
import time
from typing import Any, List, Optional, Tuple

from trinity.common.weights import SyncTimeoutError, TransferOffer
from trinity.runtime.roles import PENDING, WAIT_SLICE_S, call, call_all_within, call_each_within

logger = logging.getLogger(__name__)


class EngineWeights:
    """Weight loading for a role with ``config``, ``engines`` (the rollout engines),
    ``sync_actor``, ``report`` and ``loaded_version``."""

    def _collective(self) -> bool:
        """Whether the weights come by the trainer's broadcast (``sync_method: nccl``)."""
        return self.config.synchronizer.sync_method == "nccl"

    def _lost(self, engines: List[Any]) -> str:
        """Why engines that restarted (with their initial weights) cannot reload by nccl."""
        names = ", ".join(str(self.engines.index(engine)) for engine in engines)
        return (
            f"rollout engine {names} restarted and lost model version {self.loaded_version}; "
            "synchronizer.sync_method nccl sends each version once, to every engine at once, "
            "so it cannot send it again: with sync_method memory or checkpoint a restarted "
            "engine reloads the current weights"
        )

    def _load_into(self, engines: List[Any], weights: Any, version: int) -> None:
        """Every engine of ``engines`` loads ``weights`` of ``version``, within
        ``synchronizer.sync_timeout``; an engine that did not is named with the phase it was
        in: ``send`` (the weights had not reached it) or ``load`` (it was loading them). A
        ``TransferOffer`` (nccl) goes to each engine with its rank in the trainer's group."""
        timeout = self.config.synchronizer.sync_timeout
        args = [
            (
                weights.for_engine(self.engines.index(engine))
                if isinstance(weights, TransferOffer)
                else weights,
                version,
            )
            for engine in engines
        ]
        loaded = call_each_within(engines, "load_weights", args, timeout)
        stuck = [
            engine for engine, result in zip(engines, loaded, strict=True) if result is PENDING
        ]
        if not stuck:
            return
        phases = call_all_within(stuck, "sync_phase", (), 5.0)
        named = [
            f"rollout engine {self.engines.index(engine)} ({engine_phase(phase)})"
            for engine, phase in zip(stuck, phases, strict=True)
        ]
        raise SyncTimeoutError(
            f"model version {version} did not reach {', '.join(named)} within "
            f"synchronizer.sync_timeout={timeout:g}s; see the engine's log"
        )

    def _releases(self, version: int) -> bool:
        """Whether the engines give their weights up while waiting for ``version``: in a
        colocated stage, when the trainer publishes every weight (a LoRA sync sends only
        the adapted layers, so the engines keep theirs)."""
        return (
            self.config.mode == "colocate"
            and version > self.loaded_version
            and not self.config.model.lora_configs
        )

    def _wait_for_trainer(self, version: Optional[int]) -> Any:
        """(version, weights) from the synchronizer once it has ``version`` (None: once the
        trainer finished, with its last weights), waiting in slices and saying so."""
        timeout = self.config.synchronizer.sync_timeout
        start, since = time.monotonic(), time.time()
        what = "finish" if version is None else f"publish model version {version}"
        while (left := timeout - (time.monotonic() - start)) > 0:
            wait = min(WAIT_SLICE_S, left)
            have = self.loaded_version if self._collective() else None
            if version is None:
                found = call(self.sync_actor, "wait_finished", wait, have)
            else:
                found = call(self.sync_actor, "wait_for", version, wait, have)
            if found is not None and self._took_early(found, version):
                start = time.monotonic()
                continue
            if found is not None:
                self.report.done()
                return found
            self.report.wait(
                f"the trainer to {what} (synchronizer.sync_timeout={timeout:g}s)", since=since
            )
        latest = call(self.sync_actor, "published")
        raise SyncTimeoutError(
            f"the trainer did not {what} within synchronizer.sync_timeout={timeout:g}s "
            f"(latest published: {latest}); it is slow or stuck: see its log"
        )

    def _took_early(self, found: Tuple[int, List[Any]], version: Optional[int]) -> bool:
        """``nccl``: the trainer waits in its broadcast of each version it publishes until
        the engines join, so a version newer than theirs is taken at once, also one older
        than the ``version`` this wait is for (then the wait goes on); True when it was."""
        if not self._collective() or found[0] <= self.loaded_version or not found[1]:
            return False
        if version is not None and found[0] >= version:
            return False  # what the wait is for: the caller loads it
        self._load_into(self.engines, found[1][0], found[0])
        self.loaded_version = found[0]
        return True


def engine_phase(answer: Any) -> str:
    """How a stuck engine's ``sync_phase`` answer reads in an error."""
    if answer == "load":
        return "phase load: it was still loading them"
    if answer == "idle":
        return "phase send: the weights had not reached it"
    return "phase unknown: it does not answer"
