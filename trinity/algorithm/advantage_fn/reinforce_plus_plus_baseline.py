"""REINFORCE++ with a group baseline: group-centred scores, whitened over the batch."""

from __future__ import annotations

from typing import Dict, Tuple

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.algorithm.advantage_fn.common import (
    group_mean_and_count,
    masked_whiten,
    require_group_ids,
)
from trinity.common.experience import ExperienceBatch


@ADVANTAGE_FN.register_module("reinforceplusplus_baseline")
class REINFORCEPlusPlusBaselineAdvantageFn(AdvantageFn):
    """REINFORCE++-baseline (veRL ``adv_estimator: reinforce_plus_plus_baseline``).

    Reads the sequence scores (``token_level_rewards`` summed, else ``rewards``),
    ``exps.group_ids`` and ``exps.action_mask``. Each score minus its group's mean score is
    broadcast over the row's action tokens, then whitened over every action token of the
    batch (so the local baseline removes the task's difficulty and the global whitening
    sets the scale). ``returns`` equal the advantages (no critic).

    A group of one is centred on its own score and so gets 0 before whitening (the plain
    formula, as this project's GRPO and RLOO); veRL instead leaves its raw score there.
    """

    needs_groups: bool = True

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        require_group_ids(exps, "reinforceplusplus_baseline")
        scores = score_of(exps)
        mean, _ = group_mean_and_count(scores, exps.group_ids)
        centred = (scores.float() - mean).unsqueeze(-1) * exps.action_mask
        exps.advantages = masked_whiten(centred, exps.action_mask)
        exps.returns = exps.advantages.clone()
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {}
