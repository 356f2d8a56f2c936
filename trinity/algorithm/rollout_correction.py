"""Rollout correction: the rollout engine's logprobs against the trainer's, per sampled token.

The engine samples from ``pi_rollout``; the trainer scores the same tokens with the same
weights (``pi_old``). The two differ when the engine is stale (asynchronous styles), runs in
lower precision, or is another implementation. With ``log_ratio = log pi_old - log
pi_rollout`` per token:

- truncated importance sampling (TIS) multiplies each token's policy-loss term by
  ``min(rho, rollout_is_threshold)``, with ``rho`` the token's ratio (``token``) or the
  product of its sequence's ratios (``sequence``). Token-level TIS: Yao et al. 2025, "Your
  Efficient RL Framework Secretly Brings You Off-Policy RL Training"; sequence-level TIS and
  the rejection below: Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL
  Collapse from the Training-Inference Mismatch" (richardli.xyz/rl-collapse);
- rejection sampling drops a token, or a whole sequence, whose ratio (token, sequence
  product, or ``geometric`` mean over the sequence) is outside
  ``[rollout_rs_threshold_lower, rollout_rs_threshold]`` (same source, its "MIS" and "Geo-RS");
- the veto drops a whole sequence holding any token whose ratio is below
  ``rollout_token_veto_threshold`` (same source).

Key and metric names are veRL's ``algorithm.rollout_correction`` ones (metrics under
``rollout_corr/``); ``k3_kl`` is Schulman's k3 estimator ("Approximating KL Divergence",
2020). Every tensor is ``(B, R)`` over response tokens (``trinity.common.experience``);
``mask`` is 1.0 on tokens the engine sampled and that count, 0.0 elsewhere.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

# Log-ratios are clamped to +-20 before exp(): exp(20) ~ 5e8 stays finite in float32 (veRL
# bounds its weights the same way).
SAFETY_BOUND = 20.0

# The name under which the trainer hands the weights to a policy loss (``rollout_is_weights``
# parameter of the built-in losses, veRL's batch key).
IS_WEIGHTS_KEY = "rollout_is_weights"

LEVELS = ("token", "sequence", "geometric")

PREFIX = "rollout_corr/"  # of every metric here but veRL's ``training/rollout_probs_diff_*``


def aggregate_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The log-ratio each token is judged by: ``token`` (B, R) its own; ``sequence`` (B, 1)
    the sum over the row's valid tokens (log of the product of ratios); ``geometric`` (B, 1)
    their mean (log of the geometric mean; 0 for a row without valid tokens)."""
    if level == "token":
        return log_ratio
    total = (log_ratio * mask).sum(-1, keepdim=True)
    if level == "sequence":
        return total
    if level == "geometric":
        return total / mask.sum(-1, keepdim=True).clamp(min=1.0)
    raise ValueError(f"unknown aggregation level '{level}'; expected one of {', '.join(LEVELS)}")


def _bounded_exp(log_value: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_value.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _rows(mask: torch.Tensor) -> torch.Tensor:
    """(B,) True on rows with at least one valid token."""
    return mask.sum(-1) > 0


def truncated_is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool = False,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Detached TIS weights (B, R), 1.0 on tokens outside ``mask``, and their statistics.

    ``w = min(exp(a), threshold)`` with ``a`` the token's (``token``) or its row's summed
    (``sequence``) log-ratio; no lower truncation. ``batch_normalize`` then divides by the
    mean weight over valid tokens (``token``) or over rows (``sequence``).

    Metrics (before truncation unless said): ``rollout_is_mean``/``_max``/``_min`` over
    valid tokens; ``rollout_is_ratio_fraction_high``/``_low``: share of tokens (``token``) or
    rows (``sequence``) above ``threshold`` / below ``1 / threshold``; ``rollout_is_std``
    and ``rollout_is_eff_sample_size`` (``1 / mean((w / mean w)^2)``) of the weights clamped
    to ``[1 / threshold, threshold]``, as veRL computes them.
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout_is must be token or sequence, got '{level}'")
    judged = aggregate_log_ratio(log_ratio, mask, level)
    raw = _bounded_exp(judged).expand_as(log_ratio)
    valid = mask > 0
    lower = 1.0 / threshold
    if level == "token":
        high = _token_mean((raw > threshold).float(), mask)
        low = _token_mean((raw < lower).float(), mask)
    else:
        rows = _rows(mask)
        high = (judged[rows] > math.log(threshold)).float().mean()
        low = (judged[rows] < math.log(lower)).float().mean()
    bounded = raw.clamp(lower, threshold)
    normalized = bounded / _token_mean(bounded, mask)
    metrics = {
        "rollout_is_mean": _token_mean(raw, mask).item(),
        "rollout_is_max": raw[valid].max().item(),
        "rollout_is_min": raw[valid].min().item(),
        "rollout_is_ratio_fraction_high": high.item(),
        "rollout_is_ratio_fraction_low": low.item(),
        "rollout_is_std": (_token_mean(bounded.square(), mask) - _token_mean(bounded, mask) ** 2)
        .clamp(min=0.0)
        .sqrt()
        .item(),
        "rollout_is_eff_sample_size": 1.0 / _token_mean(normalized.square(), mask).item(),
    }
    weights = raw.clamp(max=threshold)
    if batch_normalize:
        if level == "token":
            factor = _token_mean(weights, mask)
        else:  # every token of a row holds the row's weight: one value per row
            factor = weights[:, 0][_rows(mask)].mean()
        weights = weights / factor.clamp(min=1e-8)
        metrics["rollout_is_batch_norm_factor"] = factor.item()
    return torch.where(valid, weights, torch.ones_like(weights)).detach(), metrics


def rejection_mask(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    upper: float,
    lower: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """(B, R) 0.0 on valid tokens whose judged ratio (``aggregate_log_ratio`` at ``level``)
    lies outside ``[lower, upper]`` (``lower`` None: ``1 / upper``), else 1.0; compared in
    log space, so no bound clips it. Metrics: ``rollout_rs_masked_fraction`` (share of valid tokens
    rejected) and ``rollout_rs_seq_masked_fraction`` (share of rows with a valid token that
    lose at least one)."""
    lower = 1.0 / upper if lower is None else lower
    judged = aggregate_log_ratio(log_ratio, mask, level)
    log_lower = math.log(lower) if lower > 0 else -math.inf
    outside = ((judged < log_lower) | (judged > math.log(upper))).expand_as(log_ratio)
    rejected = outside & (mask > 0)
    metrics = {
        "rollout_rs_masked_fraction": _token_mean(rejected.float(), mask).item(),
        "rollout_rs_seq_masked_fraction": rejected.any(-1)[_rows(mask)].float().mean().item(),
    }
    return (~rejected).to(mask.dtype), metrics


def veto_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """(B, R) 0.0 on the valid tokens of rows holding a valid token whose (unclamped) ratio
    is below ``threshold``, else 1.0 (``log_ratio`` outside ``mask`` is never read). Metrics:
    ``rollout_is_veto_fraction`` (share of rows with a valid token that are vetoed) and
    ``rollout_is_catastrophic_token_fraction`` (share of valid tokens below ``threshold``)."""
    catastrophic = (log_ratio < math.log(threshold)) & (mask > 0)
    vetoed = catastrophic.any(-1, keepdim=True)
    metrics = {
        "rollout_is_veto_fraction": vetoed.squeeze(-1)[_rows(mask)].float().mean().item(),
        "rollout_is_catastrophic_token_fraction": _token_mean(catastrophic.float(), mask).item(),
    }
    return (~(vetoed & (mask > 0))).to(mask.dtype), metrics


def mismatch_metrics(
    trainer_logprob: torch.Tensor, rollout_logprob: torch.Tensor, mask: torch.Tensor
) -> Dict[str, float]:
    """How far the engine's logprobs are from the trainer's, over valid tokens (none: {}).

    With ``d = trainer - rollout`` per token and per-row means over the row's valid tokens
    (rows without one left out), veRL's off-policy diagnostics:
    ``kl = mean(-d)`` (KL(pi_rollout || pi_old), k1), ``k3_kl = mean(exp(d) - d - 1)``,
    ``training_ppl``/``rollout_ppl``: the row mean of ``exp(-row mean logprob)``,
    ``training_log_ppl``/``rollout_log_ppl``: the row mean of ``-row mean logprob``,
    ``log_ppl_diff`` (mean, ``_max``, ``_min`` over rows) and ``log_ppl_abs_diff`` of
    ``row mean rollout - row mean trainer``, ``ppl_ratio = mean(exp(log_ppl_diff))`` (> 1:
    the trainer finds the tokens less likely), ``chi2_token = mean(exp(2 d)) - 1`` and
    ``chi2_seq = mean over rows of exp(2 sum d) - 1``. This project's additions:
    ``logprob_abs_diff_mean`` / ``_max`` of ``|d|``. veRL's debug metrics (their own
    prefix, ``training/``): ``rollout_probs_diff_mean``/``_max``/``_std`` of
    ``|exp(trainer) - exp(rollout)|``. The others are named ``rollout_corr/<name>``.
    """
    valid, rows = mask > 0, _rows(mask)
    if not bool(valid.any()):
        return {}
    d = trainer_logprob - rollout_logprob
    count = mask.sum(-1)[rows]
    train_mean = (trainer_logprob * mask).sum(-1)[rows] / count
    rollout_mean = (rollout_logprob * mask).sum(-1)[rows] / count
    log_ppl_diff = rollout_mean - train_mean
    probs_diff = (trainer_logprob.exp() - rollout_logprob.exp()).abs()[valid]
    seq_log_ratio = (d * mask).sum(-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics = {
        "kl": _token_mean(-d, mask).item(),
        "k3_kl": _token_mean(torch.expm1(d) - d, mask).item(),
        "training_ppl": torch.exp(-train_mean).mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
        "rollout_ppl": torch.exp(-rollout_mean).mean().item(),
        "rollout_log_ppl": (-rollout_mean).mean().item(),
        "log_ppl_diff": log_ppl_diff.mean().item(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff.max().item(),
        "log_ppl_diff_min": log_ppl_diff.min().item(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
        "chi2_token": (_token_mean(_bounded_exp(d).square(), mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * seq_log_ratio).mean() - 1.0).item(),
        "logprob_abs_diff_mean": _token_mean(d.abs(), mask).item(),
        "logprob_abs_diff_max": d.abs()[valid].max().item(),
    }
    out = {f"{PREFIX}{key}": value for key, value in metrics.items()}
    out["training/rollout_probs_diff_mean"] = probs_diff.mean().item()
    out["training/rollout_probs_diff_max"] = probs_diff.max().item()
    out["training/rollout_probs_diff_std"] = (
        probs_diff.std().item() if probs_diff.numel() > 1 else 0.0
    )
    return out


def correct_rollout(
    trainer_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    mask: torch.Tensor,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Optional[float] = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Optional[float] = None,
    rollout_rs_threshold_lower: Optional[float] = None,
    rollout_token_veto_threshold: Optional[float] = None,
) -> Tuple[Optional[torch.Tensor], torch.Tensor, Dict[str, float]]:
    """(IS weights (B, R) or None, keep (B, R), metrics): the policy loss multiplies its
    per-token term by the weights, and the loss mask is multiplied by ``keep`` (0.0 on
    rejected or vetoed tokens). Both are 1.0 outside ``mask``, which nothing judges.

    The arguments after ``mask`` are ``algorithm.rollout_correction``'s keys. Rejection
    (``rollout_rs``) and the veto only zero ``keep``; the weights come from the ratios of
    every valid token. Metrics are ``rollout_corr/<name>`` (``truncated_is_weights``,
    ``rejection_mask``, ``veto_mask``) plus ``mismatch_metrics``; none when ``mask``
    selects no token.
    """
    kept = torch.ones_like(mask)
    if not bool((mask > 0).any()):
        return None, kept, {}
    log_ratio = trainer_logprob - rollout_logprob
    metrics: Dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, found = truncated_is_weights(
            log_ratio, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(found)
    if rollout_rs is not None:
        keep, found = rejection_mask(
            log_ratio, mask, rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower
        )
        kept = kept * keep
        metrics.update(found)
    if rollout_token_veto_threshold is not None:
        keep, found = veto_mask(log_ratio, mask, rollout_token_veto_threshold)
        kept = kept * keep
        metrics.update(found)
    out = {f"{PREFIX}{key}": value for key, value in metrics.items()}
    out.update(mismatch_metrics(trainer_logprob, rollout_logprob, mask))
    return weights, kept, out
