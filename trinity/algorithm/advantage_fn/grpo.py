"""GRPO advantages: each reward normalised within its group of responses to one task."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Dict, Optional, Sequence, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.common.experience import ExperienceBatch


def group_stats(
    scores: torch.Tensor, group_ids: Sequence[Hashable]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: its group's mean, unbiased std (``torch.std``, as veRL; 0 for a group of one)
    and size, each ``(B,)``."""
    index_of: Dict[Hashable, int] = {}
    ids = [index_of.setdefault(g, len(index_of)) for g in group_ids]
    idx = torch.tensor(ids, device=scores.device)
    scores = scores.float()
    zeros = torch.zeros(len(index_of), device=scores.device)
    count = zeros.index_add(0, idx, torch.ones_like(scores))
    mean = zeros.index_add(0, idx, scores) / count
    var = zeros.index_add(0, idx, (scores - mean[idx]) ** 2) / (count - 1).clamp(min=1)
    return mean[idx], var.sqrt()[idx], count[idx]


def group_normalized_scores(
    scores: torch.Tensor,
    group_ids: Sequence[Hashable],
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
    lone_rows_raw: bool = False,
) -> torch.Tensor:
    """GRPO's outcome advantage per sequence.

    Args:
        scores: ``(B,)`` one score per sequence.
        group_ids: ``B`` ids; rows sharing an id form a group (answer the same task).
        epsilon: added to the group std so a group of equal scores gives 0, not 0/0.
        norm_by_std: False drops the division by the std (Dr. GRPO); the mean is still
            subtracted.
        lone_rows_raw: a group of one row takes veRL's mean 0 and std 1 (its advantage is
            ``s / (1 + epsilon)``, or ``s`` without ``norm_by_std``) instead of 0.

    Returns:
        ``(B,)`` advantages ``(s - mean_g) / (std_g + epsilon)`` where ``std_g`` is the
        unbiased std (``torch.std``, as veRL). A group with a single row has no baseline
        to compare against and gets 0 unless ``lone_rows_raw``.
    """
    mean, std, count = group_stats(scores, group_ids)
    lone = count < 2
    if lone_rows_raw:
        mean = torch.where(lone, torch.zeros_like(mean), mean)
        std = torch.where(lone, torch.ones_like(std), std)
    deviation = scores.float() - mean
    if norm_by_std:
        deviation = deviation / (std + epsilon)
    if lone_rows_raw:
        return deviation
    return torch.where(lone, torch.zeros_like(deviation), deviation)


@ADVANTAGE_FN.register_module("grpo")
class GRPOAdvantageFn(AdvantageFn):
    """Group-relative advantage, broadcast over the response's action tokens.

    Returns equal advantages, as in veRL (GRPO has no critic to regress on them).

    ``std_threshold`` (POLARIS's filter, as the original's): the rows of a group whose
    score std is at most it, or that is a group of one, leave the batch, since their
    advantages carry (almost) no signal; ``critic/filtered_count`` counts them. When that
    would leave nothing, the batch is trained as it is (its advantages are all about 0), so
    the step completes, as DAPO's dynamic sampling does.
    """

    needs_groups: bool = True

    def __init__(
        self,
        epsilon: float = 1e-6,
        norm_adv_by_std_in_grpo: bool = True,
        std_threshold: Optional[float] = None,
    ) -> None:
        self.epsilon = epsilon
        self.norm_adv_by_std_in_grpo = norm_adv_by_std_in_grpo
        self.std_threshold = std_threshold

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        if any(not g for g in exps.group_ids):
            raise ValueError(
                "GRPO needs Experience.group_id on every experience (the runner sets it to "
                "the task id); found an empty one"
            )
        seq_adv = group_normalized_scores(
            score_of(exps), exps.group_ids, self.epsilon, self.norm_adv_by_std_in_grpo
        )
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        if self.std_threshold is None:
            return exps, advantage_metrics(exps)
        _, std, count = group_stats(score_of(exps), exps.group_ids)
        keep = ((count > 1) & (std > self.std_threshold)).nonzero().flatten().tolist()
        filtered = len(exps) - len(keep) if keep else 0
        if keep and filtered:
            exps = exps.select(keep)
        return exps, {**advantage_metrics(exps), "critic/filtered_count": float(filtered)}

    @classmethod
    def default_args(cls) -> Dict:
        return {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": True, "std_threshold": None}
