"""The "dapo" strategy: DAPO's dynamic sampling (drop zero-variance groups, read on) and its
overlong reward shaping (Yu et al. 2025, "DAPO", sections 3.2 and 3.4)."""

from __future__ import annotations

import base64
import logging
from typing import Any, Dict, List, Optional, Tuple

import torch

from trinity.algorithm.reward_shaping import overlong_penalty
from trinity.algorithm.sample_strategy.base import SAMPLE_STRATEGY, ExperienceReader, SampleStrategy
from trinity.algorithm.sample_strategy.default import batch_metrics
from trinity.common.experience import Experience

logger = logging.getLogger(__name__)

Group = List[Experience]


def split_groups(exps: List[Experience], group_size: int, final: bool) -> Tuple[List[Group], Group]:
    """Cut ``exps`` into runs of consecutive experiences sharing ``group_id``.

    Every run but the last is complete (the next experience starts another group). The last
    run is complete once it has ``group_size`` members, or when ``final`` (the reader has
    ended); otherwise it is returned as the remainder, to be completed by the next read.
    """
    runs: List[Group] = []
    for exp in exps:
        if not exp.group_id:
            raise ValueError(
                "dapo filters whole groups, so every experience needs a group_id (the runner "
                "sets it to the task id); found an empty one"
            )
        if runs and runs[-1][0].group_id == exp.group_id:
            runs[-1].append(exp)
        else:
            runs.append([exp])
    if runs and not final and len(runs[-1]) < group_size:
        return runs[:-1], runs[-1]
    return runs, []


def zero_variance(group: Group) -> bool:
    """All rewards equal (missing counts as 0, as in ``ExperienceBatch``): every advantage of
    the group would be 0, so it carries no gradient."""
    return len({float(e.reward or 0.0) for e in group}) == 1


@SAMPLE_STRATEGY.register_module("dapo")
class DAPOSampleStrategy(SampleStrategy):
    """Gathers ``batch_size`` experiences from groups whose rewards differ.

    Groups are filtered on the task reward before overlong shaping, as DAPO filters on
    accuracy: the length penalty alone must not make an all-correct group look informative.
    A group that does not fit in the batch, or a group whose last members have not arrived
    yet, is kept for the next step (and saved in ``state_dict``), never discarded. After
    ``max_read_batches`` reads in one step the batch is returned as it is, with
    ``sample/max_read_batches_reached`` = 1.

    Args:
        reader: the experience buffer reader.
        group_size: rollouts per task (``algorithm.repeat_times``).
        max_read_batches: most reads per step.
        overlong_buffer_len: DAPO's ``L_cache``; 0 turns overlong shaping off.
        overlong_penalty_factor: penalty at the length limit.
        max_response_tokens: the length limit ``L_max`` (``model.max_response_tokens``).
        timeout: seconds the first read of a step may wait (see ``DefaultSampleStrategy``).
        refill_timeout: seconds each further read may wait before the step goes ahead
            with the groups it has.
    """

    def __init__(
        self,
        reader: ExperienceReader,
        group_size: Optional[int] = None,
        max_read_batches: int = 10,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
        max_response_tokens: Optional[int] = None,
        timeout: Optional[float] = None,
        refill_timeout: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(reader, **kwargs)
        if group_size is None or group_size < 2:
            raise ValueError(
                f"dapo needs group_size >= 2 (algorithm.repeat_times), got {group_size}: a "
                "single rollout per task always has zero reward variance"
            )
        if max_read_batches < 1:
            raise ValueError(f"max_read_batches must be >= 1, got {max_read_batches}")
        if overlong_buffer_len < 0:
            raise ValueError(f"overlong_buffer_len must be >= 0, got {overlong_buffer_len}")
        if overlong_buffer_len and (
            max_response_tokens is None or overlong_buffer_len > max_response_tokens
        ):
            raise ValueError(
                f"dapo overlong shaping (overlong_buffer_len = {overlong_buffer_len}) needs "
                f"max_response_tokens >= it (model.max_response_tokens), got {max_response_tokens}"
            )
        self.group_size = group_size
        self.max_read_batches = max_read_batches
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor
        self.max_response_tokens = max_response_tokens
        self.timeout = timeout
        self.refill_timeout = refill_timeout
        self.pending: List[Experience] = []  # read but not yet returned (in read order)

    def sample(self, step: int, batch_size: int) -> Tuple[List[Experience], Dict]:
        if batch_size % self.group_size:
            raise ValueError(
                f"dapo returns whole groups: the train batch size ({batch_size}) must be a "
                f"multiple of group_size ({self.group_size})"
            )
        kept: List[Experience] = []
        stats = {"groups_kept": 0, "groups_dropped": 0, "read_batches": 0}
        self._dropped: List[Experience] = []
        ended = False
        while True:
            full = self._take_groups(kept, batch_size, ended, stats)
            if full or ended or stats["read_batches"] >= self.max_read_batches:
                break
            want = max(batch_size - len(kept), self.group_size) - len(self.pending)
            # Refills wait briefly: with on-policy syncing the explorer cannot produce more
            # until this step is trained, so waiting longer would only stall both sides.
            timeout = self.timeout if stats["read_batches"] == 0 else self.refill_timeout
            try:
                got = self.reader.read(want, timeout=timeout)
            except StopIteration:
                ended = True
                continue
            stats["read_batches"] += 1
            if not got:
                break
            self.pending += got
        if not kept and self._dropped:
            # Only uninformative groups arrived: train on them (their advantages are zero)
            # rather than not at all, so the step completes and weights stay in sync.
            kept, stats["fallback_groups"] = self._dropped, len(self._dropped) // self.group_size
        if not kept and ended and not self.pending:
            if stats["groups_dropped"]:
                logger.warning("step %d: dropped %d groups", step, stats["groups_dropped"])
            raise StopIteration("the experience buffer has ended")
        if not kept:
            logger.warning(
                "step %d: no group with differing rewards in %d reads", step, stats["read_batches"]
            )
        metrics = {**batch_metrics(kept), **{f"sample/{k}": float(v) for k, v in stats.items()}}
        metrics["sample/max_read_batches_reached"] = float(not full and not ended)
        metrics["sample/pending"] = float(len(self.pending))
        metrics["sample/overlong_penalty_mean"] = self._shape_overlong(kept)
        return kept, metrics

    def _take_groups(
        self, kept: List[Experience], batch_size: int, final: bool, stats: Dict[str, int]
    ) -> bool:
        """Move the complete groups of ``pending`` into ``kept`` (dropping zero-variance
        ones) while they fit; True once no further group fits in the batch."""
        groups, self.pending = split_groups(self.pending, self.group_size, final)
        for i, group in enumerate(groups):
            if zero_variance(group):
                stats["groups_dropped"] += 1
                if len(self._dropped) + len(group) <= batch_size:
                    self._dropped += group
                continue
            if len(kept) + len(group) > batch_size:
                self.pending = [e for g in groups[i:] for e in g] + self.pending
                return True
            kept += group
            stats["groups_kept"] += 1
        return len(kept) >= batch_size

    def _shape_overlong(self, exps: List[Experience]) -> float:
        """Add DAPO's overlong penalty to each reward; returns the mean penalty."""
        if not self.overlong_buffer_len or not exps:
            return 0.0
        lengths = torch.tensor([e.response_length for e in exps])
        penalties = overlong_penalty(
            lengths,
            self.max_response_tokens,
            self.overlong_buffer_len,
            self.overlong_penalty_factor,
        )
        for exp, penalty in zip(exps, penalties.tolist(), strict=True):
            exp.info["overlong_penalty"] = penalty
            exp.reward = float(exp.reward or 0.0) + penalty
        return penalties.mean().item()

    def state_dict(self) -> Dict:
        # extra.json is JSON: the held-back experiences travel as base64 of their bytes. The
        # buffer package pulls in `datasets`, so it is imported only when a checkpoint is made.
        from trinity.buffer.codec import encode_experience

        blobs = [base64.b64encode(encode_experience(e)).decode("ascii") for e in self.pending]
        return {"pending": blobs}

    def load_state_dict(self, state: Dict) -> None:
        from trinity.buffer.codec import decode_experience

        blobs = state.get("pending", [])
        self.pending = [decode_experience(base64.b64decode(b)) for b in blobs]

    @classmethod
    def default_args(cls) -> Dict:
        return {
            "max_read_batches": 10,
            "overlong_buffer_len": 0,
            "overlong_penalty_factor": 1.0,
            "refill_timeout": 5.0,
        }
