"""The critic's clipped value loss (PPO's value-function clipping, as veRL computes it)."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from trinity.algorithm.utils import aggregate_loss, check_loss_agg_mode, masked_mean


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """``0.5 * agg(max((v - R)^2, (v_clip - R)^2))`` with ``v_clip = old_v + clip(v - old_v,
    -c, c)``: the value may not gain by moving more than ``c`` from its rollout-time estimate.

    Args:
        values: ``(B, R)`` current critic predictions (with gradient).
        old_values: ``(B, R)`` predictions of the critic that scored the rollout.
        returns: ``(B, R)`` regression targets (from the advantage fn).
        action_mask: ``(B, R)`` 1 on tokens that count.
        cliprange_value: ``c`` (veRL ``critic.cliprange_value``).
        loss_agg_mode: see ``trinity.algorithm.utils.aggregate_loss``.

    Returns:
        The scalar loss and metrics ``vf_loss``, ``vf_clipfrac`` (share of valid tokens where
        the clipped error was the larger one) and ``vpred_mean`` (mean valid prediction).
    """
    check_loss_agg_mode(loss_agg_mode)
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    err_unclipped = (values - returns).square()
    err_clipped = (clipped - returns).square()
    loss = 0.5 * aggregate_loss(
        torch.maximum(err_unclipped, err_clipped), action_mask, loss_agg_mode
    )
    metrics = {
        "vf_loss": loss.item(),
        "vf_clipfrac": masked_mean((err_clipped > err_unclipped).float(), action_mask).item(),
        "vpred_mean": masked_mean(values, action_mask).item(),
    }
    return loss, metrics
