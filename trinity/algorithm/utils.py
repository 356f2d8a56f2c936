"""Masked reductions shared by the algorithm components.

Every tensor here is a ``(B, R)`` matrix over response tokens (see
``trinity.common.experience``) and every mask is 1 on tokens that count, 0 on
padding and on tokens the model did not generate.
"""

from __future__ import annotations

from typing import Optional

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all elements when ``dim`` is None)."""
    product = values * mask
    return product.sum() if dim is None else product.sum(dim=dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None
) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1.

    Args:
        values: any shape, e.g. ``(B, R)``.
        mask: same shape as ``values``.
        dim: reduce this dimension only (e.g. ``-1`` gives one mean per row); None = all.

    Returns:
        The masked mean; 0 where the mask selects nothing (instead of 0/0 = NaN, so a
        fully padded row or micro-batch adds nothing to the loss).
    """
    mask = mask.to(values.dtype)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    # Counts are whole numbers, so the clamp only changes the empty case (0 / tiny = 0).
    return masked_sum(values, mask, dim) / count.clamp(min=1e-8)


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    norm: Optional[float] = None,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar (veRL's ``loss_agg_mode``).

    Args:
        loss_mat: ``(B, R)`` per-token losses.
        mask: ``(B, R)`` 1 on tokens that count.
        mode: one of
            - ``"token-mean"``: mean over all valid tokens of the batch (long responses
              weigh more, every token counts the same);
            - ``"seq-mean-token-sum"``: per-row sum of valid tokens, then mean over rows;
            - ``"seq-mean-token-mean"``: per-row mean of valid tokens, then mean over rows
              (a row without valid tokens contributes 0);
            - ``"seq-mean-token-sum-norm"``: per-row sum divided by a constant (``norm``,
              default ``R`` = the mask's column count), then mean over rows: Dr. GRPO's
              length-unbiased loss. veRL sums these terms over rows instead of averaging,
              which only scales the loss by ``B``; the mean keeps every mode on the same
              per-row scale, so micro-batches can be weighted by their row count.
        norm: divisor of ``"seq-mean-token-sum-norm"``; set it to a fixed budget (e.g. the
            maximum response length) to keep it constant across batches.
        weights: ``(B, R)`` factors of the per-token losses, applied before the reduction
            and leaving the normaliser alone (the trainer's detached rollout-correction
            importance weights, ``trinity/algorithm/rollout_correction.py``); None: 1.

    Rows are averaged over all ``B`` rows, fully masked ones included, as veRL does.

    Returns:
        A scalar tensor.
    """
    mask = mask.to(loss_mat.dtype)
    if weights is not None:
        loss_mat = loss_mat * weights
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum-norm":
        divisor = float(mask.shape[-1]) if norm is None else float(norm)
        return (masked_sum(loss_mat, mask, dim=-1) / divisor).mean()
    raise _unknown_mode(mode)


def check_loss_agg_mode(mode: str) -> str:
    """Return ``mode`` if it is a valid loss aggregation mode, else raise ``ValueError``.

    Components call this in their constructor so a typo fails at start-up, not at step 1.
    """
    if mode not in LOSS_AGG_MODES:
        raise _unknown_mode(mode)
    return mode


def _unknown_mode(mode: str) -> ValueError:
    return ValueError(f"unknown loss_agg_mode '{mode}'; valid modes: {', '.join(LOSS_AGG_MODES)}")
