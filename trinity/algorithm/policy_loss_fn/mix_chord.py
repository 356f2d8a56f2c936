"""CHORD: the MIX loss with a scheduled SFT weight mu and token-wise phi (arXiv:2508.11408)."""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN
from trinity.algorithm.policy_loss_fn.mix import MIXPolicyLossFn
from trinity.algorithm.policy_loss_fn.sft_phi import SFTPhiLossFn


def mu_schedule(
    updates_done: int, warmup_steps: int, decay_steps: int, peak: float, valley: float
) -> float:
    """CHORD-mu's weight of the SFT term after ``updates_done`` optimiser steps.

    Linear from 0 to ``peak`` over ``warmup_steps``, then a half cosine from ``peak`` down to
    ``valley`` over ``decay_steps``, then ``valley``. With no warm-up and no decay it is the
    constant ``valley`` (the paper's CHORD-phi keeps mu fixed). The paper gives no formula for
    the schedule: its section 4.3 decays mu from 0.9 to 0.05 over the first 200 steps and its
    appendix mentions a warm-up before the decay; this shape is upstream Trinity-RFT's option.
    """
    if updates_done < warmup_steps:
        return peak * updates_done / warmup_steps
    into_decay = updates_done - warmup_steps
    if into_decay >= decay_steps:
        return valley
    return valley + (peak - valley) * 0.5 * (1.0 + math.cos(math.pi * into_decay / decay_steps))


@POLICY_LOSS_FN.register_module("mix_chord")
class MIXCHORDPolicyLossFn(MIXPolicyLossFn):
    """``(1 - mu) * ppo(RL rows) + mu * sft(expert rows)`` with ``mu`` following a schedule.

    CHORD (Zhang et al. 2025, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised
    Fine-Tuning and Reinforcement Learning via Dynamic Weighting", arXiv:2508.11408) writes
    SFT as an auxiliary objective of on-policy RL: its hybrid loss
    ``L = (1 - mu) L_GRPO + mu L_SFT`` (Eq. 3 of the ICLR 2026 version, section 3.2), here the
    PPO-clipped loss on the policy's own rows (GRPO advantages for ``algorithm_type:
    mix_chord``; the paper's ``L_GRPO`` is its Eq. 2, token-mean, no KL) and the SFT loss on
    the expert rows ``sample_strategy: mix`` adds (Eq. 1, token-mean). Two controls, both the
    paper's:

    - CHORD-mu, the global weight: ``mu`` warms up to ``mu_peak`` and decays to
      ``mu_valley`` (``mu_schedule``), moving the policy from imitating the expert to its own
      exploration;
    - CHORD-phi, the token weight: with ``enable_phi_function`` the SFT term is ``sft_phi``
      (each expert token weighted by ``p (1 - p)``, Eqs. 5-6), which keeps expert data from
      overwriting what the policy is sure of.

    The defaults, upstream Trinity-RFT's, are CHORD-phi with a constant ``mu`` of 0.1; a
    CHORD-mu run sets e.g. ``mu_peak: 0.9, mu_valley: 0.05, mu_decay_steps: 200``. phi is
    about 0 where ``p`` is, so a policy that gives the expert's tokens almost no probability
    (an untrained model) learns nothing from them with phi on: use plain SFT there.

    Args:
        mu_warmup_steps: optimiser steps over which ``mu`` rises linearly from 0 to the peak.
        mu_decay_steps: steps over which it then falls (half cosine) to the valley.
        mu_peak / mu_valley: the schedule's highest and final weight, in [0, 1].
        enable_phi_function: weigh expert tokens by ``p (1 - p)`` (CHORD-phi); False: plain SFT.
        clip_range, clip_range_low, clip_range_high, clip_ratio_c, loss_agg_mode,
            sft_loss_agg_mode, grpo_loss_agg_mode: as for ``mix``.
    """

    def __init__(
        self,
        mu_warmup_steps: int = 0,
        mu_decay_steps: int = 0,
        mu_peak: float = 0.1,
        mu_valley: float = 0.1,
        enable_phi_function: bool = True,
        clip_range: float = 0.2,
        clip_range_low: Optional[float] = None,
        clip_range_high: Optional[float] = None,
        clip_ratio_c: Optional[float] = None,
        loss_agg_mode: str = "token-mean",
        sft_loss_agg_mode: Optional[str] = None,
        grpo_loss_agg_mode: Optional[str] = None,
    ) -> None:
        super().__init__(
            mu_peak,
            clip_range,
            clip_range_low,
            clip_range_high,
            clip_ratio_c,
            loss_agg_mode,
            sft_loss_agg_mode,
            grpo_loss_agg_mode,
        )
        if not 0.0 <= mu_valley <= 1.0:
            raise ValueError(f"mu_valley (the SFT weight) must be in [0, 1], got {mu_valley}")
        if mu_warmup_steps < 0 or mu_decay_steps < 0:
            raise ValueError(
                f"mu_warmup_steps and mu_decay_steps must be >= 0, got {mu_warmup_steps} "
                f"and {mu_decay_steps}"
            )
        self.schedule = (mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
        if enable_phi_function:
            self.sft = SFTPhiLossFn(self.sft_loss_agg_mode)

    def sft_weight(self, step: Optional[torch.Tensor]) -> float:
        """``mu`` after ``step - 1`` updates, ``step`` being the ``(B,)`` 1-based training
        step on every row (the trainer fills it)."""
        if step is None:
            raise ValueError("mix_chord schedules mu by the training step: pass step ((B,))")
        return mu_schedule(int(step.max().item()) - 1, *self.schedule)

    @classmethod
    def default_args(cls) -> Dict:
        return {
            "mu_warmup_steps": 0,
            "mu_decay_steps": 0,
            "mu_peak": 0.1,
            "mu_valley": 0.1,
            "enable_phi_function": True,
            "clip_range": 0.2,
            "clip_ratio_c": None,
            "loss_agg_mode": "token-mean",
        }
