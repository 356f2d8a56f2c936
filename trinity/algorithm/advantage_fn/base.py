"""The ``AdvantageFn`` interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch

from trinity.common.experience import ExperienceBatch
from trinity.common.registry import Registry

ADVANTAGE_FN: Registry = Registry("advantage_fn", base=lambda: AdvantageFn)

# ``exps.extra`` keys. The trainer sets the first two for an advantage fn with
# ``needs_policy_scores``: (B, R) logprob of each response token and entropy of its
# distribution under the policy being trained, before this step's update, without grad.
POLICY_LOGPROB_KEY = "policy_logprob"
POLICY_ENTROPY_KEY = "policy_entropy"
# An advantage fn may set this (B, R) mask, 1 on the tokens the actor's loss keeps: the
# trainer multiplies the actor's ``action_mask`` by it (``trainer/actor_batch.py``).
ACTOR_MASK_KEY = "actor_mask"


class AdvantageFn(ABC):
    """Computes ``advantages`` and ``returns`` of a batch before the policy update.

    Constructor arguments come from ``algorithm.advantage_fn_args`` in the config,
    with ``default_args()`` filling the ones the user did not set.

    Class attributes:
        needs_groups: the advantage compares the rollouts of one task, so it needs
            ``repeat_times > 1`` and whole groups in a batch (default False). The config
            check and the trainer read it; a group-based plugin sets it to True.
        needs_turn_states: it reads each experience's ``turn_starts`` and ``turn_states``
            (the environment state of every turn), so the config check refuses a training
            taskset whose workflow does not declare ``records_turn_states`` (default False).
        needs_policy_scores: it reads the current policy's logprobs and entropies
            (``exps.extra[POLICY_LOGPROB_KEY]``, ``[POLICY_ENTROPY_KEY]``), which the
            trainer computes (one more forward pass without grad) only when this is True
            (default False).
    """

    needs_groups: bool = False
    needs_turn_states: bool = False
    needs_policy_scores: bool = False

    @abstractmethod
    def __call__(self, exps: ExperienceBatch, **kwargs) -> Tuple[ExperienceBatch, Dict]:
        """Set ``exps.advantages`` and ``exps.returns`` (both ``(B, R)``); return the batch
        and a dict of metrics (full metric names, e.g. ``critic/advantages/mean``)."""

    @classmethod
    def default_args(cls) -> Dict:
        """Default constructor arguments, used where the config leaves them unset."""
        return {}


def score_of(exps: ExperienceBatch) -> torch.Tensor:
    """``(B,)`` sequence scores: the sum of ``token_level_rewards`` when a KL fn has set
    them (so an in-reward KL penalty is included), else the scalar ``rewards``."""
    if exps.token_level_rewards is not None:
        return exps.token_level_rewards.sum(dim=-1)
    return exps.rewards.float()


def advantage_metrics(exps: ExperienceBatch) -> Dict[str, float]:
    """veRL-style statistics, ``critic/<name>/{mean,max,min}`` for ``score`` (the scalar
    reward), ``rewards`` (its sum with any in-reward KL penalty), both per sequence, and
    ``advantages`` and ``returns`` over valid response tokens."""
    valid = exps.action_mask > 0
    named = {
        "score": exps.rewards.float(),
        "rewards": score_of(exps),
        "advantages": exps.advantages[valid],
        "returns": exps.returns[valid],
    }
    metrics: Dict[str, float] = {}
    for name, values in named.items():
        if values.numel() == 0:
            continue  # no valid token in the batch: there is nothing to describe
        metrics[f"critic/{name}/mean"] = values.mean().item()
        metrics[f"critic/{name}/max"] = values.max().item()
        metrics[f"critic/{name}/min"] = values.min().item()
    return metrics
