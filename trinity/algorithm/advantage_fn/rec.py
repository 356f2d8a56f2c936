"""REC advantages: each reward minus its group's mean, with optional balancing of the group."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import group_mean_and_count, require_group_ids
from trinity.algorithm.advantage_fn.grpo import group_normalized_scores
from trinity.common.experience import ExperienceBatch


def balanced_rows(scores: torch.Tensor, group_ids: List[str]) -> torch.Tensor:
    """``(B,)`` bool, the rows kept when no group may hold more below-mean rows than others:
    a group's surplus of below-mean rows is dropped, chosen at random (torch's seeded RNG)."""
    mean, _ = group_mean_and_count(scores, group_ids)
    below = scores.float() < mean
    keep = torch.ones_like(below)
    for group in dict.fromkeys(group_ids):
        rows = torch.tensor([i for i, g in enumerate(group_ids) if g == group])
        negative = rows[below[rows]]
        surplus = len(negative) - (len(rows) - len(negative))
        if surplus > 0:
            keep[negative[torch.randperm(len(negative))[:surplus]]] = False
    return keep


@ADVANTAGE_FN.register_module("rec")
class RECAdvantageFn(AdvantageFn):
    """``A = r - mean_group(r)`` per sequence, broadcast over its action tokens.

    The group-relative REINFORCE advantage of Yao et al. 2025, "Group-relative REINFORCE is
    secretly an off-policy algorithm" (arXiv:2509.24203), which the ``rec`` policy loss
    weighs: the group mean is the baseline, and, unlike GRPO, no division by the group's
    standard deviation unless asked. ``drop: balance`` shapes the data as the paper's second
    principle asks (actively shaping the training distribution): in a group with more
    below-mean responses than others, the surplus is dropped at random (advantage 0) and the
    mean is taken over the rows kept.

    Args:
        epsilon: added to the std when ``std_normalize`` divides by it.
        std_normalize: divide by the group's (unbiased) std, as GRPO does.
        drop: None, or ``"balance"`` (above).
    """

    needs_groups: bool = True

    def __init__(
        self,
        epsilon: float = 1e-6,
        std_normalize: bool = False,
        drop: Optional[Literal["balance"]] = None,
    ) -> None:
        if drop not in (None, "balance"):
            raise ValueError(f"drop must be null or 'balance', got {drop!r}")
        self.epsilon, self.std_normalize, self.drop = epsilon, std_normalize, drop

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "rec")
        scores = score_of(exps).float()
        keep = torch.ones(len(scores), dtype=torch.bool)
        if self.drop == "balance":
            keep = balanced_rows(scores, exps.group_ids)
        kept = keep.nonzero().squeeze(-1).tolist()
        seq_adv = torch.zeros_like(scores)
        seq_adv[kept] = group_normalized_scores(
            scores[kept], [exps.group_ids[i] for i in kept], self.epsilon, self.std_normalize
        )
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        metrics = advantage_metrics(exps)
        metrics["rec/dropped_frac"] = 1.0 - len(kept) / max(len(scores), 1)
        return exps, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"epsilon": 1e-6, "std_normalize": False, "drop": None}
