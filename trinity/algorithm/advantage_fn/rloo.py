"""RLOO advantages: each reward minus the mean reward of the other responses to its task."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import group_mean_and_count, require_group_ids
from trinity.common.experience import ExperienceBatch


def leave_one_out_scores(scores: torch.Tensor, group_ids: List[str]) -> torch.Tensor:
    """``(B,)`` advantages ``s_i - mean_{j != i, same group} s_j`` from ``(B,)`` scores.

    Computed as ``n / (n - 1) * (s_i - mean_group)``, the same value without a loop over
    rows. A group of one has no other response to compare with and gets 0 (veRL keeps the
    raw score there; 0 matches this project's GRPO).
    """
    mean, count = group_mean_and_count(scores, group_ids)
    scale = count / (count - 1).clamp(min=1.0)
    advantages = scale * (scores.float() - mean)
    return torch.where(count > 1, advantages, torch.zeros_like(advantages))


@ADVANTAGE_FN.register_module("rloo")
class RLOOAdvantageFn(AdvantageFn):
    """REINFORCE leave-one-out (veRL ``adv_estimator: rloo``).

    Reads the sequence scores (``token_level_rewards`` summed, else ``rewards``),
    ``exps.group_ids`` and ``exps.action_mask``; the advantage is broadcast over the action
    tokens and ``returns`` equal the advantages (no critic).
    """

    needs_groups: bool = True

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "rloo")
        seq_adv = leave_one_out_scores(score_of(exps), exps.group_ids)
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {}
