"""ReMax advantages: each reward minus the reward of a greedy response to the same prompt."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.advantage_fn.base import (
    ADVANTAGE_FN,
    AdvantageFn,
    advantage_metrics,
    score_of,
)
from trinity.common.experience import ExperienceBatch

BASELINE_KEY = "baseline_reward"


def greedy_baselines(exps: ExperienceBatch) -> torch.Tensor:
    """``(B,)`` ``exp.info["baseline_reward"]`` of each experience of the batch.

    Raises ``ValueError`` naming the first experience without it: ReMax needs the workflow
    to also decode the prompt greedily and record that response's reward.
    """
    values = []
    for i, exp in enumerate(exps.experiences):
        value = exp.info.get(BASELINE_KEY)
        if value is None:
            raise ValueError(
                f"the 'remax' advantage needs Experience.info['{BASELINE_KEY}'] (the reward "
                "of a greedy response to the same prompt) on every experience; experience "
                f"{i} (eid {exp.eid}) has none. Use a workflow that also rolls out greedily."
            )
        values.append(float(value))
    return torch.tensor(values, device=exps.action_mask.device)


@ADVANTAGE_FN.register_module("remax")
class REMAXAdvantageFn(AdvantageFn):
    """ReMax (veRL ``adv_estimator: remax``): ``A = score - r_greedy``, broadcast over the
    action tokens; ``returns`` equal the advantages (no critic).

    Reads the sequence scores (``token_level_rewards`` summed, else ``rewards``),
    ``exps.action_mask`` and ``info["baseline_reward"]`` of ``exps.experiences``. veRL
    subtracts the baseline from the per-token reward-to-go instead; the two agree unless an
    in-reward KL penalty spreads reward over the tokens, and broadcasting the sequence
    advantage keeps ReMax an outcome-level estimator like GRPO and RLOO here.
    """

    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        seq_adv = score_of(exps).float() - greedy_baselines(exps)
        exps.advantages = seq_adv.unsqueeze(-1) * exps.action_mask
        exps.returns = exps.advantages.clone()
        return exps, advantage_metrics(exps)

    @classmethod
    def default_args(cls) -> Dict:
        return {}
