"""Pure tensor helpers shared by the advantage functions.

Shapes: ``B`` rows (sequences), ``R`` response columns; every mask is ``(B, R)`` with 1 on
action tokens (the ones the model generated and the loss counts) and 0 on padding and on
tokens an environment inserted between turns.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from trinity.algorithm.kl_fn.base import last_token_rewards
from trinity.algorithm.utils import masked_mean
from trinity.common.experience import ExperienceBatch


def require_group_ids(exps: ExperienceBatch, estimator: str) -> None:
    """Raise ``ValueError`` unless every row has a non-empty ``group_id``.

    Rows with an empty id would otherwise silently form one large group.
    """
    if any(not g for g in exps.group_ids):
        raise ValueError(
            f"the '{estimator}' advantage needs Experience.group_id on every experience (the "
            "runner sets it to the task id); found an empty one"
        )


def group_index(group_ids: List[str], device: torch.device) -> Tuple[torch.Tensor, int]:
    """``(B,)`` group number of each row (in order of first appearance) and the group count."""
    index_of: dict = {}
    ids = [index_of.setdefault(g, len(index_of)) for g in group_ids]
    return torch.tensor(ids, dtype=torch.long, device=device), len(index_of)


def group_mean_and_count(
    scores: torch.Tensor, group_ids: List[str]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row, the mean score of its group and the group's size, both ``(B,)`` float.

    Args:
        scores: ``(B,)`` one score per sequence.
        group_ids: ``B`` ids; rows sharing an id answer the same task.
    """
    idx, n_groups = group_index(group_ids, scores.device)
    scores = scores.float()
    zeros = torch.zeros(n_groups, device=scores.device)
    count = zeros.index_add(0, idx, torch.ones_like(scores))
    mean = zeros.index_add(0, idx, scores) / count
    return mean[idx], count[idx]


def group_logavgexp(scores: torch.Tensor, group_ids: List[str], tau: float) -> torch.Tensor:
    """Per row, ``tau * log(mean_{j in group} exp(s_j / tau))`` of its group, ``(B,)``.

    Computed as ``tau * (max + log(sum exp(s / tau - max)) - log(n))`` so large scores or a
    small ``tau`` do not overflow ``exp``.
    """
    idx, n_groups = group_index(group_ids, scores.device)
    x = scores.float() / tau
    gmax = torch.full((n_groups,), float("-inf"), device=x.device)
    gmax = gmax.scatter_reduce(0, idx, x, reduce="amax", include_self=True)
    zeros = torch.zeros(n_groups, device=x.device)
    total = zeros.index_add(0, idx, torch.exp(x - gmax[idx]))
    count = zeros.index_add(0, idx, torch.ones_like(x))
    return (tau * (gmax + torch.log(total) - torch.log(count)))[idx]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """``(values - mean) / sqrt(var + epsilon)`` over the positions where ``mask`` is 1.

    Args:
        values: ``(B, R)``.
        mask: ``(B, R)`` 1 on the tokens that define the statistics.
        epsilon: keeps a constant batch from dividing by zero (veRL uses 1e-8).

    Returns:
        ``(B, R)`` whitened values, 0 where ``mask`` is 0. The variance is the unbiased
        one (``n / (n - 1)`` correction, as veRL's ``masked_whiten``). veRL raises when fewer
        than two tokens are valid; here one valid token gives 0 (its own mean) and none
        gives all zeros, so a degenerate batch simply carries no signal.
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    centered = (values - mean) * mask
    n = mask.sum()
    var = (centered**2).sum() / (n - 1).clamp(min=1.0)
    return centered * torch.rsqrt(var + epsilon)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``(B, R)`` reward-to-go ``G_t = r_t + gamma * G_{t'}`` where ``t'`` is the next action token.

    Only action tokens are steps: a token with mask 0 (padding, or an environment's tokens
    inside a multi-turn response) neither adds its reward nor discounts, so a later turn's
    reward reaches earlier turns as if the environment tokens were not there. veRL instead
    resets the running return at every masked token, which would cut multi-turn credit.
    Returns are 0 on masked tokens.
    """
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    out = torch.zeros_like(rewards, dtype=torch.float)
    for t in reversed(range(rewards.shape[1])):
        step = mask[:, t] > 0
        running = torch.where(step, rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(step, running, torch.zeros_like(running))
    return out


def token_rewards(exps: ExperienceBatch) -> torch.Tensor:
    """``(B, R)`` per-token rewards: ``token_level_rewards`` when a KL fn has set them, else
    each row's scalar reward on its last action token (as the KL fns place it)."""
    if exps.token_level_rewards is not None:
        return exps.token_level_rewards.float()
    return last_token_rewards(exps)
