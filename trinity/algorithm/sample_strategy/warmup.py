"""The "warmup" strategy: expert (SFT) data for the first steps, then the experience buffer."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trinity.algorithm.sample_strategy.auxiliary import (
    auxiliary_reader,
    count_metrics,
    load_reader_states,
    mark_expert,
    reader_states,
)
from trinity.algorithm.sample_strategy.base import SAMPLE_STRATEGY, ExperienceReader, SampleStrategy
from trinity.common.experience import Experience

logger = logging.getLogger(__name__)


@SAMPLE_STRATEGY.register_module("warmup")
class WarmupSampleStrategy(SampleStrategy):
    """Steps ``1..warmup_steps`` read the auxiliary buffer ``warmup_buffer``; later steps read
    the main experience buffer. Warmup experiences get ``info["is_expert"] = True``.

    If the warmup data runs out before ``warmup_steps``, sampling moves on to the main
    buffer early (logged, and ``sample/warmup_exhausted`` is 1) rather than ending training.

    Args:
        reader: the experience buffer reader.
        auxiliary_readers: readers of ``buffer.trainer_input.auxiliary_buffers`` by name.
        warmup_steps: number of warmup steps; 0 turns warmup off.
        warmup_buffer: name of the auxiliary buffer holding the warmup data.
        timeout: seconds a read may wait (see ``DefaultSampleStrategy``).
    """

    def __init__(
        self,
        reader: ExperienceReader,
        auxiliary_readers: Optional[Mapping[str, ExperienceReader]] = None,
        warmup_steps: int = 0,
        warmup_buffer: str = "sft_warmup",
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(reader, **kwargs)
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        self.timeout = timeout
        self.auxiliary: Dict[str, ExperienceReader] = {}
        if warmup_steps > 0:
            warmup = auxiliary_reader(auxiliary_readers, warmup_buffer, "warmup")
            self.auxiliary = {warmup_buffer: warmup}
        self.warmup_reader = next(iter(self.auxiliary.values()), None)
        self.warmup_exhausted = False

    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        exps = self._read_warmup(step, batch_size) if step <= self.warmup_steps else None
        in_warmup = exps is not None
        if exps is None:
            exps = self.reader.read(batch_size, timeout=self.timeout)
        metrics = count_metrics(exps, len(exps) if in_warmup else 0)
        metrics["sample/warmup"] = float(in_warmup)
        metrics["sample/warmup_exhausted"] = float(self.warmup_exhausted)
        return exps, metrics

    def _read_warmup(self, step: int, batch_size: int) -> Optional[List[Experience]]:
        """The warmup batch, or None once the warmup data has run out."""
        if self.warmup_exhausted:
            return None
        try:
            return mark_expert(self.warmup_reader.read(batch_size, timeout=self.timeout))
        except StopIteration:
            logger.warning(
                "step %d: the warmup data ran out before warmup_steps=%d; reading the "
                "experience buffer from now on",
                step,
                self.warmup_steps,
            )
            self.warmup_exhausted = True
            return None

    def state_dict(self) -> Dict:
        return {
            "warmup_exhausted": self.warmup_exhausted,
            "auxiliary": reader_states(self.auxiliary),
        }

    def load_state_dict(self, state: Dict) -> None:
        if not state:
            return
        self.warmup_exhausted = bool(state.get("warmup_exhausted", False))
        load_reader_states(self.auxiliary, state.get("auxiliary", {}))

    @classmethod
    def default_args(cls) -> Dict:
        return {"warmup_steps": 0, "warmup_buffer": "sft_warmup"}
