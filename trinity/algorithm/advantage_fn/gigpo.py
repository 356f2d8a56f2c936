"""GiGPO advantages: episode-level groups plus step-level groups of repeated environment states."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Dict, List, Literal, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import require_group_ids, token_rewards
from trinity.algorithm.advantage_fn.grpo import group_normalized_scores
from trinity.common.experience import ExperienceBatch


def turn_columns(exps: ExperienceBatch) -> torch.Tensor:
    """``(B, R)`` the turn each response column belongs to (-1 on padding), from each
    experience's ``turn_starts``; ``ValueError`` naming the task when a row has no
    ``turn_states``."""
    out = torch.full(exps.action_mask.shape, -1, dtype=torch.long)
    for row, exp in enumerate(exps.experiences):
        if exp.turn_states is None:
            raise ValueError(
                "advantage_fn gigpo needs the environment state of every turn "
                f"(Experience.turn_states), and an experience of task '{exp.group_id}' has "
                "none: its workflow must record them (merge_turns(..., states=...)); "
                "guess_number_workflow does"
            )
        starts = list(exp.turn_starts or ())
        ends = starts[1:] + [exp.response_length]
        if any(not 0 <= a <= b <= exp.response_length for a, b in zip(starts, ends, strict=True)):
            raise ValueError(
                f"Experience.turn_starts {starts} of task '{exp.group_id}' are not increasing "
                f"offsets into its {exp.response_length} response tokens"
            )
        for turn, (start, end) in enumerate(zip(starts, ends, strict=True)):
            out[row, start:end] = turn
    return out.to(exps.action_mask.device)


def discounted_turn_returns(turn_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``(B, K)`` ``R_t = sum_{k >= t} gamma^(k - t) r_k`` of ``(B, K)`` per-turn rewards
    (GiGPO's Eq. 5); turns past an episode's end hold reward 0 and so add nothing."""
    out = torch.zeros_like(turn_rewards)
    running = torch.zeros(turn_rewards.shape[0], device=turn_rewards.device)
    for k in reversed(range(turn_rewards.shape[1])):
        running = turn_rewards[:, k] + gamma * running
        out[:, k] = running
    return out


@ADVANTAGE_FN.register_module("gigpo")
class GiGPOAdvantageFn(AdvantageFn):
    """Group-in-group advantages (Feng et al., 2025, "Group-in-Group Policy Optimization for
    LLM Agent Training", arXiv:2505.10978, Section 4):

    - episode level (Eq. 3): ``A^E(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F_norm`` over the
      task's group of episodes, ``R`` the episode's total reward;
    - step level: the turns of the group's episodes that answered equal environment states
      form one anchor-state group ``G^S(s)`` (Section 4.2); each turn's discounted return
      ``R_t`` (Eq. 5) is compared within it: ``A^S = (R_t - mean_G R) / F_norm`` (Eq. 7);
    - combined (Eq. 8): ``A = A^E + omega * A^S``, on every token of that turn's reply.

    An episode is one experience (``merge_turns``): its turns start at ``turn_starts`` and
    answered ``turn_states``, which the workflow records. A turn's reward ``r_k`` is what the
    token rewards put inside its reply (the scalar reward sits on the last action token), so
    with the usual end-of-episode reward ``R_t = gamma^(T - t) * R``. A state seen once is a
    group of one: ``R_t`` is its own mean, so ``A^S = 0`` (Eq. 7) and ``A^E`` alone remains;
    a state revisited inside one episode compares those visits. Equal returns give 0 at
    either level (``epsilon`` keeps a zero std from dividing).

    Args:
        omega: the weight of the step-level advantage (the paper's ``omega``, 1).
        gamma: the discount of later turns' rewards in ``R_t`` (the paper's 0.95).
        fnorm: ``"std"`` divides by the group's standard deviation (as GRPO, so at
            ``omega = 0`` this is GRPO's advantage); ``"none"`` takes ``F_norm = 1``, the
            paper's other variant (Table 1 reports both).
        epsilon: added to the standard deviation.
    """

    needs_groups: bool = True
    needs_turn_states: bool = True

    def __init__(
        self,
        omega: float = 1.0,
        gamma: float = 0.95,
        fnorm: Literal["std", "none"] = "std",
        epsilon: float = 1e-6,
    ) -> None:
        if fnorm not in ("std", "none"):
            raise ValueError(f"fnorm must be 'std' or 'none', got {fnorm!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        self.omega, self.gamma, self.fnorm, self.epsilon = omega, gamma, fnorm, epsilon

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "gigpo")
        by_std = self.fnorm == "std"
        turns = turn_columns(exps)
        in_turn = turns >= 0
        n_turns = int(turns.max().item()) + 1 if in_turn.any() else 1
        rewards = torch.zeros(len(exps), n_turns, device=turns.device)
        rewards.scatter_add_(1, turns.clamp(min=0), token_rewards(exps) * in_turn)
        returns = discounted_turn_returns(rewards, self.gamma)

        episode = group_normalized_scores(score_of(exps), exps.group_ids, self.epsilon, by_std)
        cells: List[Tuple[int, int]] = []
        anchors: List[Hashable] = []
        for row, exp in enumerate(exps.experiences):
            for turn, state in enumerate(exp.turn_states or ()):
                cells.append((row, turn))
                anchors.append((exp.group_id, state))
        step = torch.zeros(len(exps), n_turns, device=turns.device)
        step_values = torch.zeros(0)
        if cells:  # every row has turn states; a row may still hold zero turns
            rows, cols = torch.tensor(cells, device=turns.device).T
            step_values = group_normalized_scores(
                returns[rows, cols], anchors, self.epsilon, by_std
            )
            step[rows, cols] = step_values
        step_tokens = step.gather(1, turns.clamp(min=0)) * in_turn
        exps.advantages = (episode.unsqueeze(-1) + self.omega * step_tokens) * exps.action_mask
        exps.returns = exps.advantages.clone()
        metrics = advantage_metrics(exps)
        metrics.update(self._group_metrics(anchors, episode, step_values))
        return exps, metrics

    @staticmethod
    def _group_metrics(
        anchors: List[Hashable], episode: torch.Tensor, step: torch.Tensor
    ) -> Dict[str, float]:
        """How many anchor-state groups the batch formed, how many hold more than one turn
        (only those carry a step-level signal), and the mean size of each level's term."""
        sizes: Dict[Hashable, int] = {}
        for anchor in anchors:
            sizes[anchor] = sizes.get(anchor, 0) + 1
        shared = sum(1 for n in sizes.values() if n > 1)
        metrics = {
            "gigpo/anchor_groups_total": float(len(sizes)),
            "gigpo/anchor_groups_size_gt1": float(shared),
            "gigpo/anchor_group_hit_ratio": shared / len(sizes) if sizes else 0.0,
            "gigpo/mean_abs_A_E": episode.abs().mean().item(),
        }
        if step.numel():
            metrics["gigpo/mean_abs_A_S"] = step.abs().mean().item()
        return metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"omega": 1.0, "gamma": 0.95, "fnorm": "std", "epsilon": 1e-6}
