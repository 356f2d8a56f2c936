"""OPMD advantages (developer guide): each reward minus a per-group baseline."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import (
    group_logavgexp,
    group_mean_and_count,
    require_group_ids,
)
from trinity.common.experience import ExperienceBatch

OPMD_BASELINES = ("mean", "logavgexp")


def opmd_baselines(
    scores: torch.Tensor, group_ids: List[str], baseline: str, tau: float
) -> torch.Tensor:
    """``(B,)`` baseline of each row's group from ``(B,)`` scores.

    ``"mean"``: the group's mean score. ``"logavgexp"``: ``tau * log(mean(exp(s / tau)))``,
    the value of the KL-regularised optimum with temperature ``tau``, OPMD's principled
    baseline; it tends to the mean as ``tau`` grows and to the group's best score as
    ``tau`` goes to 0. A group
    of one has its own score as baseline either way, hence advantage 0.
    """
    if baseline == "mean":
        return group_mean_and_count(scores, group_ids)[0]
    if baseline == "logavgexp":
        return group_logavgexp(scores, group_ids, tau)
    raise ValueError(f"unknown opmd_baseline '{baseline}'; valid: {', '.join(OPMD_BASELINES)}")


@ADVANTAGE_FN.register_module("opmd")
class OPMDAdvantageFn(AdvantageFn):
    """OPMD advantage ``A = score - baseline(group)``, broadcast over the action tokens;
    ``returns`` equal the advantages (no critic).

    Reads the sequence scores (``token_level_rewards`` summed, else ``rewards``),
    ``exps.group_ids`` and ``exps.action_mask``.

    Args:
        opmd_baseline: ``"mean"`` or ``"logavgexp"`` (see ``opmd_baselines``).
        tau: temperature of ``"logavgexp"`` (> 0); unused by ``"mean"``. The OPMD policy
            loss has its own ``tau``; set both alike, as the guide's config does.
    """

    needs_groups: bool = True

    def __init__(self, opmd_baseline: str = "mean", tau: float = 1.0) -> None:
        if opmd_baseline not in OPMD_BASELINES:
            raise ValueError(
                f"unknown opmd_baseline '{opmd_baseline}'; valid: {', '.join(OPMD_BASELINES)}"
            )
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.opmd_baseline = opmd_baseline
        self.tau = tau

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "opmd")
        scores = score_of(exps).float()
        baseline = opmd_baselines(scores, exps.group_ids, self.opmd_baseline, self.tau)
        exps.advantages = (scores - baseline).unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {"opmd_baseline": "mean", "tau": 1.0}
