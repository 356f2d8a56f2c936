"""The batch the actor trains on: the step's batch with some tokens out of its loss.

Two steps take tokens out of the actor's ``action_mask`` alone, so that the critic and the
batch metrics still see every token: rollout correction's rejection and veto (with its IS
weights into ``extra``), and an advantage fn's own filter (``ACTOR_MASK_KEY`` in ``extra``,
Clip_B's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

from trinity.algorithm.advantage_fn.base import ACTOR_MASK_KEY
from trinity.algorithm.rollout_correction import IS_WEIGHTS_KEY, correct_rollout
from trinity.common.experience import ExperienceBatch

# Where the engine's logprobs go once rollout correction rescores old_logprob (veRL's name).
ROLLOUT_LOGPROBS = "rollout_log_probs"


def sampled_tokens(batch: ExperienceBatch) -> torch.Tensor:
    """(B, R) 1.0 on the action tokens whose rollout-engine logprob the batch holds (rows
    without logprobs, e.g. expert demonstrations, have none)."""
    rows = [e.logprobs is not None for e in batch.experiences]
    has = torch.tensor(rows, dtype=batch.action_mask.dtype, device=batch.action_mask.device)
    return batch.action_mask * has[:, None]


def actor_batch(
    batch: ExperienceBatch, correction: Optional[Any]
) -> Tuple[ExperienceBatch, Dict[str, float]]:
    """The batch the actor trains on and the rollout correction's metrics.

    ``correction`` is ``algorithm.rollout_correction`` when enabled (else None): it weighs
    and rejects tokens by ``batch.old_logprob`` against ``extra[ROLLOUT_LOGPROBS]``. The
    batch itself is returned when nothing applies."""
    if correction is None and ACTOR_MASK_KEY not in batch.extra:
        return batch, {}
    extra, metrics = dict(batch.extra), {}
    mask = batch.action_mask * extra.pop(ACTOR_MASK_KEY, 1.0)
    if correction is not None:
        settings = correction.model_dump(exclude={"bypass_mode", "use_policy_gradient"})
        weights, keep, metrics = correct_rollout(
            batch.old_logprob, extra[ROLLOUT_LOGPROBS], sampled_tokens(batch), **settings
        )
        mask = mask * keep
        if weights is not None:
            extra[IS_WEIGHTS_KEY] = weights
    return dataclasses.replace(batch, action_mask=mask, extra=extra), metrics
