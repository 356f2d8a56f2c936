"""The default strategy: the next ``batch_size`` experiences of the buffer, in order."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from trinity.algorithm.sample_strategy.base import SAMPLE_STRATEGY, ExperienceReader, SampleStrategy
from trinity.common.experience import Experience


def batch_metrics(exps: List[Experience]) -> Dict[str, float]:
    """``sample/experience_count`` and ``sample/model_version/{mean,min,max}``: how many
    experiences a step trains on and which weights produced them (their staleness); with
    replay, ``buffer/replayed`` (how many were trained on before) and ``buffer/use_count/max``."""
    metrics: Dict[str, float] = {"sample/experience_count": float(len(exps))}
    if exps:
        versions = [e.model_version for e in exps]
        metrics["sample/model_version/mean"] = sum(versions) / len(versions)
        metrics["sample/model_version/min"] = float(min(versions))
        metrics["sample/model_version/max"] = float(max(versions))
    uses = [e.info["use_count"] for e in exps if "use_count" in e.info]
    if uses:  # the queue tags every row with its use count when replay is on (buffer/replay.py)
        metrics["buffer/replayed"] = float(sum(u > 1 for u in uses))
        metrics["buffer/use_count/max"] = float(max(uses))
    return metrics


@SAMPLE_STRATEGY.register_module("default")
class DefaultSampleStrategy(SampleStrategy):
    """One read of ``batch_size`` experiences.

    Args:
        reader: the experience buffer reader.
        timeout: seconds a read may wait before returning a short batch; None leaves it to
            the reader (the trainer passes ``experience_buffer.max_read_timeout``).
    """

    def __init__(
        self, reader: ExperienceReader, timeout: Optional[float] = None, **kwargs: Any
    ) -> None:
        super().__init__(reader, **kwargs)
        self.timeout = timeout

    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        exps = self.reader.read(batch_size, timeout=self.timeout)
        if len(exps) > batch_size:
            raise RuntimeError(
                f"the experience reader returned {len(exps)} experiences for a read of "
                f"{batch_size}; refusing to drop or silently enlarge the batch"
            )
        return exps, batch_metrics(exps)
