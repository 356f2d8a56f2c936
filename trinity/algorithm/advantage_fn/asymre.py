"""AsymRE advantages: each reward minus a baseline set below its group's mean reward."""

from __future__ import annotations

from typing import Dict, Tuple

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import group_mean_and_count, require_group_ids
from trinity.common.experience import ExperienceBatch


@ADVANTAGE_FN.register_module("asymre")
class AsymREAdvantageFn(AdvantageFn):
    """``A = r - V`` with ``V = mean_group(r) + baseline_shift`` (Arnal et al., 2025,
    "Asymmetric REINFORCE for off-policy RL", arXiv:2506.20520: the advantage ``A = r - V``
    of its off-policy REINFORCE objective ``J = E_mu[log pi(y) (r(y) - V)]``).

    A baseline below the expected reward (``baseline_shift < 0``) weighs successes more than
    failures, which the paper finds stabilises off-policy training; at or above it the
    policy's support collapses. The paper's ``V^mu`` (the behaviour policy's expected
    reward) is estimated by the task's group mean here, as in its LLM experiments. No
    division by the standard deviation: the scale of ``r - V`` is the paper's.

    Args:
        baseline_shift: ``delta V``, added to the group mean; the paper recommends a small
            negative value (-0.1 is this default).
    """

    needs_groups: bool = True

    def __init__(self, baseline_shift: float = -0.1) -> None:
        self.baseline_shift = baseline_shift

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "asymre")
        scores = score_of(exps).float()
        mean, _ = group_mean_and_count(scores, exps.group_ids)
        seq_adv = scores - (mean + self.baseline_shift)
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {"baseline_shift": -0.1}
