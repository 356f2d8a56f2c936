"""DPO: direct preference optimisation on (chosen, rejected) response pairs."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import masked_sum


@POLICY_LOSS_FN.register_module("dpo")
class DPOLossFn(PolicyLossFn):
    """Sigmoid DPO loss (with the conservative-DPO label smoothing).

    Rows come in interleaved pairs ``[chosen_0, rejected_0, chosen_1, rejected_1, ...]``.
    With sequence logprobs summed over action tokens (``pc``/``pr`` under the policy,
    ``rc``/``rr`` under the reference) and ``margin = (pc - rc) - (pr - rr)``, the loss is
    the mean over pairs of
    ``-(1 - ls) * logsigmoid(beta * margin) - ls * logsigmoid(-beta * margin)``.

    Args:
        beta: inverse temperature of the implicit reward ``beta * (log pi - log pi_ref)``.
        label_smoothing: assumed probability ``ls`` that a pair's preference label is
            flipped (0 = standard DPO).
        loss_agg_mode: not used by the loss itself (a mean over pairs); the trainer reads
            it to weigh micro-batches and aggregate the KL/entropy terms. The per-sequence
            default makes micro-batches weigh by their row count, as a mean over pairs
            requires.
    """

    def __init__(
        self,
        beta: float = 0.1,
        label_smoothing: float = 0.0,
        loss_agg_mode: str = "seq-mean-token-mean",
    ) -> None:
        super().__init__(loss_agg_mode)
        if not 0.0 <= label_smoothing <= 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
        self.beta = beta
        self.label_smoothing = label_smoothing

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        ref_logprob: Optional[torch.Tensor],
        action_mask: torch.Tensor,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """All inputs ``(B, R)`` with ``B`` even; returns the loss and ``dpo_loss``,
        ``chosen_reward``, ``rejected_reward``, ``reward_accuracy`` and ``reward_margin``
        (each a mean over pairs)."""
        if ref_logprob is None:
            raise ValueError("the DPO loss needs reference logprobs (ref_logprob)")
        if logprob.shape[0] == 0 or logprob.shape[0] % 2 != 0:
            raise ValueError(
                f"DPO needs interleaved (chosen, rejected) row pairs, got {logprob.shape[0]} "
                "rows; keep pairs together (an even micro-batch size, no batch balancing)"
            )
        # Implicit reward log-ratio per sequence; the reference carries no gradient anyway.
        seq_ratio = masked_sum(logprob - ref_logprob.detach(), action_mask, dim=-1)
        chosen = self.beta * seq_ratio[0::2]
        rejected = self.beta * seq_ratio[1::2]
        logits = chosen - rejected  # beta * margin
        ls = self.label_smoothing
        losses = -(1.0 - ls) * F.logsigmoid(logits) - ls * F.logsigmoid(-logits)
        loss = losses.mean()
        metrics = {
            "dpo_loss": loss.item(),
            "chosen_reward": chosen.mean().item(),
            "rejected_reward": rejected.mean().item(),
            "reward_accuracy": (chosen > rejected).float().mean().item(),
            "reward_margin": logits.mean().item(),
        }
        return loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"beta": 0.1, "label_smoothing": 0.0, "loss_agg_mode": "seq-mean-token-mean"}
