"""Mixed RL + SFT loss: PPO on the policy's own rows, NLL on expert demonstrations."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.policy_loss_fn.ppo import PPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.sft import SFTLossFn

# The original's mix losses took the run's batch sizes to weight each micro-batch's two terms;
# this trainer weighs micro-batches from the batch it holds (trainer/policy_step.py).
_BOOKKEEPING = "batch bookkeeping the trainer derives itself from the batch it trains"
MIX_INERT_ARGS = {
    key: _BOOKKEEPING
    for key in (
        "ngpus_trainer",
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "train_batch_size_usual",
        "train_batch_size_expert",
        "use_dynamic_bsz",
    )
}


def expert_rows(expert_mask: Optional[torch.Tensor], batch_size: int) -> torch.Tensor:
    """``(B,)`` bool: True on expert rows. Checks ``expert_mask`` is one flag per row."""
    if expert_mask is None:
        raise ValueError(
            "the mix loss needs expert_mask ((B,) 1.0 on expert rows) in the batch; "
            "use a sample strategy that marks expert experiences (e.g. 'mix')"
        )
    if expert_mask.dim() != 1 or expert_mask.shape[0] != batch_size:
        raise ValueError(
            f"expert_mask must have shape ({batch_size},), got {tuple(expert_mask.shape)}"
        )
    return expert_mask > 0


@POLICY_LOSS_FN.register_module("mix")
class MIXPolicyLossFn(PolicyLossFn):
    """``(1 - mu) * ppo(non-expert rows) + mu * sft(expert rows)``.

    Each side is aggregated over its own rows with ``loss_agg_mode`` (e.g. ``token-mean``
    averages the PPO term over RL tokens only); a side without rows in the (micro-)batch
    contributes 0 and reports no metrics.

    Args:
        mu: weight of the SFT term, in [0, 1].
        clip_range, clip_range_low, clip_range_high, clip_ratio_c, loss_agg_mode: passed
            to ``PPOPolicyLossFn`` (``loss_agg_mode`` to the SFT term as well).
        sft_loss_agg_mode / grpo_loss_agg_mode: the SFT / PPO term's own aggregation
            instead of ``loss_agg_mode``.
    """

    inert_args = MIX_INERT_ARGS

    def __init__(
        self,
        mu: float = 0.1,
        clip_range: float = 0.2,
        clip_range_low: Optional[float] = None,
        clip_range_high: Optional[float] = None,
        clip_ratio_c: Optional[float] = None,
        loss_agg_mode: str = "token-mean",
        sft_loss_agg_mode: Optional[str] = None,
        grpo_loss_agg_mode: Optional[str] = None,
    ) -> None:
        super().__init__(loss_agg_mode)
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"mu (the SFT weight) must be in [0, 1], got {mu}")
        self.mu = mu
        self.ppo = PPOPolicyLossFn(
            clip_range,
            clip_range_low,
            clip_range_high,
            clip_ratio_c,
            grpo_loss_agg_mode or loss_agg_mode,
        )
        self.sft_loss_agg_mode = sft_loss_agg_mode or loss_agg_mode
        self.sft = SFTLossFn(self.sft_loss_agg_mode)

    def sft_weight(self, step: Optional[torch.Tensor]) -> float:
        """``mu`` for this call: the constant ``mu`` (a subclass may schedule it by
        ``step``, the ``(B,)`` training step the trainer puts on every row)."""
        return self.mu

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        expert_mask: Optional[torch.Tensor],
        step: Optional[torch.Tensor] = None,
        rollout_is_weights: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict]:
        """Token inputs ``(B, R)``, ``expert_mask`` and ``step`` ``(B,)``. Metrics: the PPO
        ones prefixed ``usual/`` (``usual/pg_loss``, ...), the SFT one prefixed ``expert/``
        (``expert/sft_loss``) and ``mu``. ``rollout_is_weights`` weigh the PPO term only
        (expert rows have no rollout to correct)."""
        mu = self.sft_weight(step)
        expert = expert_rows(expert_mask, logprob.shape[0])
        usual = ~expert
        loss = logprob.new_zeros(())
        metrics: Dict[str, float] = {"mu": mu}
        if usual.any():
            pg_loss, pg_metrics = self.ppo(
                logprob=logprob[usual],
                old_logprob=old_logprob[usual],
                action_mask=action_mask[usual],
                advantages=advantages[usual],
                rollout_is_weights=None
                if rollout_is_weights is None
                else rollout_is_weights[usual],
            )
            loss = loss + (1.0 - mu) * pg_loss
            metrics.update({f"usual/{k}": v for k, v in pg_metrics.items()})
        if expert.any():
            sft_loss, sft_metrics = self.sft(
                logprob=logprob[expert], action_mask=action_mask[expert]
            )
            loss = loss + mu * sft_loss
            metrics.update({f"expert/{k}": v for k, v in sft_metrics.items()})
        return loss, metrics

    @classmethod
    def default_args(cls) -> Dict:
        return {"mu": 0.1, "clip_range": 0.2, "clip_ratio_c": None, "loss_agg_mode": "token-mean"}
