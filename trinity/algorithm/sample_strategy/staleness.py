"""The "staleness_control" strategy: bound how old the policy behind an experience may be."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.algorithm.sample_strategy.base import SAMPLE_STRATEGY, ExperienceReader, SampleStrategy
from trinity.algorithm.sample_strategy.default import batch_metrics
from trinity.common.experience import Experience

logger = logging.getLogger(__name__)

MODES = ("drop", "downweight")


def staleness(exp: Experience, step: int) -> int:
    """Model versions between the weights that produced ``exp`` and the weights train step
    ``step`` updates (those of step ``step - 1``); 0 for fully on-policy data."""
    return (step - 1) - exp.model_version


class StaleOnly(StopIteration):
    """The reader ended with only stale experiences left (``dropped`` of them)."""

    def __init__(self, dropped: int) -> None:
        super().__init__(f"only stale experiences were left ({dropped} dropped)")
        self.dropped = dropped


def fresh_groups(exps: List[Experience], step: int, bound: int) -> List[Experience]:
    """``exps`` without the groups that have a member more than ``bound`` versions old at
    train step ``step`` (a group split over runners may mix versions: it goes whole)."""

    def old(e: Experience) -> bool:
        return staleness(e, step) > bound

    stale = {e.group_id for e in exps if e.group_id and old(e)}
    return [e for e in exps if (e.group_id not in stale if e.group_id else not old(e))]


def read_fresh(
    reader: ExperienceReader, want: int, step: int, bound: int, timeout: Optional[float] = None
) -> Tuple[List[Experience], int]:
    """Read until ``want`` experiences within ``bound`` versions are gathered, the reader
    ends, or a read comes back short (the reader timed out: waiting again would stall the
    step); returns (kept, dropped). Raises ``StaleOnly`` when the reader ended and only stale
    experiences had come."""
    kept: List[Experience] = []
    dropped = 0
    while len(kept) < want:
        ask = want - len(kept)
        try:
            exps = reader.read(ask, timeout=timeout)
        except StopIteration:
            if kept:
                break
            if dropped:
                raise StaleOnly(dropped) from None
            raise
        fresh = fresh_groups(exps, step, bound)
        dropped += len(exps) - len(fresh)
        kept += fresh
        if len(exps) < ask:
            break
    return kept, dropped


@SAMPLE_STRATEGY.register_module("staleness_control")
class StalenessControlSampleStrategy(SampleStrategy):
    """Drops or down-weights experiences more than ``max_staleness`` versions old.

    ``drop`` discards them (counted in ``sample/stale_dropped``) and reads on until
    ``batch_size`` fresh experiences are gathered, the reader ends, or a read comes back
    short (the reader timed out: waiting again would stall the step). ``downweight`` keeps
    them with ``info["sample_weight"] = decay ** (staleness - max_staleness)`` (1.0 within
    the bound), which a loss may use to scale each sequence.

    Args:
        reader: the experience buffer reader.
        max_staleness: largest staleness (model versions) kept at full weight.
        mode: ``"drop"`` or ``"downweight"``.
        decay: weight factor per version beyond ``max_staleness`` (downweight), in (0, 1].
        timeout: seconds a read may wait (see ``DefaultSampleStrategy``).
    """

    def __init__(
        self,
        reader: ExperienceReader,
        max_staleness: int = 1,
        mode: str = "drop",
        decay: float = 0.5,
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(reader, **kwargs)
        if mode not in MODES:
            raise ValueError(f"staleness_control mode = {mode!r}; choose one of {MODES}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}; use mode 'drop' to discard")
        self.max_staleness = max_staleness
        self.mode = mode
        self.decay = decay
        self.timeout = timeout
        self.total_dropped = 0

    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        if self.mode == "drop":
            exps, dropped = self._read_fresh(step, batch_size)
            metrics = batch_metrics(exps)
            metrics["sample/stale_dropped"] = float(dropped)
            metrics["sample/stale_dropped_total"] = float(self.total_dropped)
        else:
            exps = self.reader.read(batch_size, timeout=self.timeout)
            metrics = {**batch_metrics(exps), **self._downweight(exps, step)}
        if exps:
            ages = [staleness(e, step) for e in exps]
            metrics["sample/staleness/mean"] = sum(ages) / len(ages)
            metrics["sample/staleness/max"] = float(max(ages))
        return exps, metrics

    def _read_fresh(self, step: int, batch_size: int) -> Tuple[List[Experience], int]:
        try:
            kept, dropped = read_fresh(
                self.reader, batch_size, step, self.max_staleness, self.timeout
            )
        except StaleOnly as exc:
            # nothing fresh is left: say what was discarded before ending the run
            self.total_dropped += exc.dropped
            logger.warning("step %d: dropped %d stale experiences", step, exc.dropped)
            raise StopIteration from exc
        self.total_dropped += dropped
        return kept, dropped

    def _downweight(self, exps: List[Experience], step: int) -> Dict[str, float]:
        weights, stale = [], 0
        for exp in exps:
            excess = staleness(exp, step) - self.max_staleness
            stale += excess > 0
            exp.info["sample_weight"] = self.decay**excess if excess > 0 else 1.0
            weights.append(exp.info["sample_weight"])
        metrics = {"sample/stale_count": float(stale)}
        if weights:
            metrics["sample/sample_weight/mean"] = sum(weights) / len(weights)
        return metrics

    def state_dict(self) -> Dict:
        return {"total_dropped": self.total_dropped}

    def load_state_dict(self, state: Dict) -> None:
        self.total_dropped = int(state.get("total_dropped", 0))

    @classmethod
    def default_args(cls) -> Dict:
        return {"max_staleness": 1, "mode": "drop", "decay": 0.5}
