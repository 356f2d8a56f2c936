"""Optimizer construction and the learning-rate curve at hand-computed steps."""

from types import SimpleNamespace

import pytest
import torch

from trinity.algorithm.optimizer import build_lr_scheduler, build_optimizer


def opt_cfg(**overrides):
    cfg = dict(
        lr=0.1,
        betas=(0.9, 0.95),
        weight_decay=0.01,
        optimizer_type="adamw",
        lr_warmup_steps=-1,
        lr_warmup_steps_ratio=0.0,
        lr_scheduler_type="constant",
        min_lr_ratio=0.0,
        num_cycles=0.5,
    )
    cfg.update(overrides)
    return SimpleNamespace(**cfg)


def lr_curve(cfg, total_steps, n):
    """The lr used by optimizer steps 0 .. n-1."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([param], cfg)
    scheduler = build_lr_scheduler(optimizer, cfg, total_steps)
    lrs = []
    for _ in range(n):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_build_optimizer_is_adamw_with_config_values():
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], opt_cfg())
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (0.1, (0.9, 0.95), 0.01)


def test_other_optimizers_are_not_supported_yet():
    with pytest.raises(ValueError, match="not supported yet"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], opt_cfg(optimizer_type="sgd"))


def test_constant_schedule_with_explicit_warmup_steps():
    # lr_warmup_steps = 4 wins over the ratio: factors 0, 1/4, 2/4, 3/4, then 1.
    lrs = lr_curve(opt_cfg(lr_warmup_steps=4, lr_warmup_steps_ratio=0.5), 10, 7)
    assert lrs == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_constant_schedule_without_warmup():
    assert lr_curve(opt_cfg(), 10, 3) == pytest.approx([0.1, 0.1, 0.1])


def test_cosine_schedule_with_warmup_ratio_and_min_lr():
    # total 10, ratio 0.2 -> 2 warm-up steps: factors 0, 0.5.
    # Then progress = (step - 2) / 8 and factor = 0.1 + 0.9 * 0.5 * (1 + cos(pi * progress)):
    #   step 2: progress 0   -> 1.0
    #   step 6: progress 0.5 -> 0.1 + 0.9 * 0.5 = 0.55
    #   step 10: progress 1  -> 0.1 (held after the last step: step 12 -> 0.1)
    cfg = opt_cfg(lr_scheduler_type="cosine", lr_warmup_steps_ratio=0.2, min_lr_ratio=0.1)
    lrs = lr_curve(cfg, 10, 13)
    assert lrs[0] == pytest.approx(0.0)
    assert lrs[1] == pytest.approx(0.05)
    assert lrs[2] == pytest.approx(0.1)
    assert lrs[6] == pytest.approx(0.055)
    assert lrs[10] == pytest.approx(0.01)
    assert lrs[12] == pytest.approx(0.01)


def test_unknown_scheduler_is_not_supported_yet():
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], opt_cfg())
    with pytest.raises(ValueError, match="not supported yet"):
        build_lr_scheduler(optimizer, opt_cfg(lr_scheduler_type="wsd"), 10)
