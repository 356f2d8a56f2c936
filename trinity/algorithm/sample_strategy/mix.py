"""The "mix" strategy: each batch holds RL experiences and a fixed share of expert (SFT) data."""

from __future__ import annotations

import logging
import math
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


def expert_count(batch_size: int, ratio: float) -> int:
    """``round(batch_size * ratio)``, halves rounded up (Python's ``round`` would send
    2.5 to 2, so the share of expert rows would depend on parity)."""
    return min(batch_size, math.floor(batch_size * ratio + 0.5))


@SAMPLE_STRATEGY.register_module("mix")
class MixSampleStrategy(SampleStrategy):
    """``batch_size - n`` RL experiences from the main reader, then ``n = round(batch_size *
    expert_data_ratio)`` expert rows from auxiliary buffer ``expert_buffer``, marked
    ``info["is_expert"] = True`` (RL rows get ``False`` unless they already say).

    The RL part is read first, so a main buffer that has ended ends sampling before any
    expert row is consumed. When the expert data runs out, the RL rows already read are
    still returned, and later batches are RL only (logged; ``sample/expert_exhausted`` = 1).

    Args:
        reader: the experience buffer reader.
        auxiliary_readers: readers of ``buffer.trainer_input.auxiliary_buffers`` by name.
        expert_buffer: name of the auxiliary buffer holding the expert data.
        expert_data_ratio: share of each batch taken from the expert data, in [0, 1].
        timeout: seconds a read may wait (see ``DefaultSampleStrategy``).
    """

    def __init__(
        self,
        reader: ExperienceReader,
        auxiliary_readers: Optional[Mapping[str, ExperienceReader]] = None,
        expert_buffer: str = "sft_dataset",
        expert_data_ratio: float = 0.5,
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(reader, **kwargs)
        if not 0.0 <= expert_data_ratio <= 1.0:
            raise ValueError(f"expert_data_ratio must be in [0, 1], got {expert_data_ratio}")
        self.expert_data_ratio = expert_data_ratio
        self.timeout = timeout
        self.auxiliary: Dict[str, ExperienceReader] = {}
        if expert_data_ratio > 0:
            expert = auxiliary_reader(auxiliary_readers, expert_buffer, "mix")
            self.auxiliary = {expert_buffer: expert}
        self.expert_reader = next(iter(self.auxiliary.values()), None)
        self.expert_exhausted = False

    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        n_expert = 0 if self.expert_exhausted else expert_count(batch_size, self.expert_data_ratio)
        rl: List[Experience] = []
        if batch_size - n_expert > 0:
            rl = self.reader.read(batch_size - n_expert, timeout=self.timeout)
        for exp in rl:
            exp.info.setdefault("is_expert", False)
        expert = self._read_expert(step, n_expert) if n_expert else []
        exps = rl + expert
        metrics = count_metrics(exps, len(expert))
        metrics["sample/expert_exhausted"] = float(self.expert_exhausted)
        return exps, metrics

    def _read_expert(self, step: int, n: int) -> List[Experience]:
        try:
            return mark_expert(self.expert_reader.read(n, timeout=self.timeout))
        except StopIteration:
            logger.warning(
                "step %d: the expert data ran out; batches are RL experiences only from now on",
                step,
            )
            self.expert_exhausted = True
            return []

    def state_dict(self) -> Dict:
        return {
            "expert_exhausted": self.expert_exhausted,
            "auxiliary": reader_states(self.auxiliary),
        }

    def load_state_dict(self, state: Dict) -> None:
        if not state:
            return
        self.expert_exhausted = bool(state.get("expert_exhausted", False))
        load_reader_states(self.auxiliary, state.get("auxiliary", {}))

    @classmethod
    def default_args(cls) -> Dict:
        return {"expert_buffer": "sft_dataset", "expert_data_ratio": 0.5}

    @classmethod
    def buffer_rows(cls, batch_size: int, args: Dict) -> int:
        return batch_size - expert_count(batch_size, float(args.get("expert_data_ratio", 0.5)))
