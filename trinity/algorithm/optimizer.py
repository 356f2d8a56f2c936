"""The actor's optimizer and learning-rate schedule, from ``algorithm.optimizer``.

``cfg`` is any object with the attributes of the config's ``OptimizerConfig``: ``lr``,
``betas``, ``weight_decay``, ``optimizer_type``, ``lr_warmup_steps``,
``lr_warmup_steps_ratio``, ``lr_scheduler_type``, ``min_lr_ratio``, ``num_cycles``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

# Adam's epsilon (torch's AdamW default), named so a Tinker run sends the same
# (trinity/trainer/tinker_mapping.py): the config has no key for it.
ADAM_EPS = 1e-8


def build_optimizer(params: Iterable, cfg: Any) -> torch.optim.Optimizer:
    """AdamW over ``params`` with ``cfg.lr``, ``cfg.betas`` and ``cfg.weight_decay``."""
    if cfg.optimizer_type != "adamw":
        raise ValueError(
            f"algorithm.optimizer.optimizer_type = {cfg.optimizer_type} is not supported yet "
            "(supported: adamw)"
        )
    # Not fused: fused AdamW is ~5x faster on CPU (~1% of a tiny-model GRPO step) but rounds
    # differently, which moved the quickstart's SFT result (held-out 0.40 -> 0.28).
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=ADAM_EPS, weight_decay=cfg.weight_decay
    )


def warmup_steps(cfg: Any, total_steps: int) -> int:
    """``lr_warmup_steps`` when >= 0, else ``int(lr_warmup_steps_ratio * total_steps)``."""
    if cfg.lr_warmup_steps >= 0:
        return int(cfg.lr_warmup_steps)
    return int(cfg.lr_warmup_steps_ratio * total_steps)


def lr_factor_fn(cfg: Any, total_steps: int) -> Callable[[int], float]:
    """The multiplier of ``cfg.lr`` at each optimizer step (0-based), as veRL schedules it.

    Both schedules warm up linearly from 0 over the warm-up steps. ``constant`` then stays
    at 1; ``cosine`` follows ``min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(2 * pi *
    num_cycles * progress))`` with ``progress`` going 0 -> 1 over the remaining steps
    (``num_cycles = 0.5`` is one half-wave down to ``min_lr_ratio``); past ``total_steps``
    the final value holds.
    """
    kind = cfg.lr_scheduler_type
    if kind not in ("constant", "cosine"):
        raise ValueError(
            f"algorithm.optimizer.lr_scheduler_type = {kind} is not supported yet "
            "(supported: constant, cosine)"
        )
    warmup = warmup_steps(cfg, total_steps)
    if kind == "cosine" and total_steps <= 0:
        raise ValueError(f"the cosine lr schedule needs total_steps > 0, got {total_steps}")
    min_ratio, cycles = cfg.min_lr_ratio, cfg.num_cycles

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        wave = 0.5 * (1.0 + math.cos(2 * math.pi * cycles * progress))
        return min_ratio + (1.0 - min_ratio) * wave

    return factor


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_steps: int) -> LambdaLR:
    """A ``LambdaLR`` applying ``lr_factor_fn(cfg, total_steps)``; step it once per
    optimizer step."""
    return LambdaLR(optimizer, lr_factor_fn(cfg, total_steps))
