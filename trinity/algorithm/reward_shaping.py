"""Reward shaping: pure functions that adjust sequence rewards before advantages are computed."""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (DAPO paper, eq. 13), added to the task reward.

    Args:
        lengths: ``(B,)`` response lengths in tokens.
        max_len: the generation limit ``L_max`` (``model.max_response_tokens``).
        buffer_len: the punishment interval ``L_cache``; responses longer than
            ``max_len - buffer_len`` are penalised linearly.
        factor: the penalty at ``len == max_len`` (DAPO uses 1.0).

    Returns:
        ``(B,)`` float penalties: ``0`` when ``len <= max_len - buffer_len``, else
        ``-factor * (len - (max_len - buffer_len)) / buffer_len``. Like the paper's veRL
        recipe the value is not clipped at ``-factor``: a length over ``max_len`` (which
        generation does not produce) is penalised further rather than hidden.
    """
    if buffer_len <= 0:
        raise ValueError(f"overlong buffer_len must be positive, got {buffer_len}")
    if buffer_len > max_len:
        raise ValueError(
            f"overlong buffer_len ({buffer_len}) exceeds max_len ({max_len}): every response "
            "would be penalised"
        )
    expected = max_len - buffer_len
    exceed = (lengths.float() - expected).clamp(min=0.0)
    return -factor * exceed / buffer_len
