"""The figures a train step logs about its batch and its speed (veRL's metric names)."""

from __future__ import annotations

from typing import Dict

import torch

from trinity.common.experience import ExperienceBatch
from trinity.utils.device import peak_memory_gb


def _stats(prefix: str, values: torch.Tensor) -> Dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def batch_metrics(batch: ExperienceBatch, max_response_tokens: int) -> Dict[str, float]:
    """Rewards, response and prompt lengths (and the share of responses cut at
    ``max_response_tokens``), advantages and returns where the algorithm computed them."""
    resp_len = batch.action_mask.sum(-1)
    prompt_len = torch.tensor([e.prompt_length for e in batch.experiences])
    metrics = {**_stats("critic/rewards", batch.rewards), **_stats("response_length", resp_len)}
    metrics["response_length/clip_ratio"] = (resp_len >= max_response_tokens).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_len))
    if batch.advantages is not None:
        mask = batch.action_mask.bool()
        metrics.update(_stats("critic/advantages", batch.advantages[mask]))
        metrics.update(_stats("critic/returns", batch.returns[mask]))
    return metrics


def perf_metrics(batch: ExperienceBatch, seconds: float, device: torch.device) -> Dict[str, float]:
    """veRL's ``perf/`` names: tokens trained (prompt + response, padding excluded), their
    rate, and on a GPU the step's peak memory (reset for the next step)."""
    tokens = float(batch.attention_mask.sum())
    metrics = {"perf/total_num_tokens": tokens, "perf/throughput": tokens / max(seconds, 1e-9)}
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = peak_memory_gb(device)
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    return metrics
