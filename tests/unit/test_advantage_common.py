"""Shared advantage helpers: whitening, group statistics, discounted returns."""

import math

import torch

from trinity.algorithm.advantage_fn.common import (
    discounted_returns,
    group_logavgexp,
    group_mean_and_count,
    masked_whiten,
)


def test_masked_whiten_hand_example():
    # Valid values 1, 2, 3 (the 100 is masked out): mean 2, unbiased var (1 + 0 + 1) / 2 = 1
    # -> -1, 0, 1 (divided by sqrt(1 + 1e-8)), 0 on the masked position.
    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    s = 1 / math.sqrt(1 + 1e-8)
    assert torch.allclose(masked_whiten(values, mask), torch.tensor([[-s, 0.0], [s, 0.0]]))


def test_masked_whiten_degenerate_masks_give_zeros_not_nan():
    values = torch.tensor([[5.0, 7.0]])
    # One valid token: it is its own mean -> 0 (veRL raises here).
    assert torch.equal(masked_whiten(values, torch.tensor([[1.0, 0.0]])), torch.zeros(1, 2))
    # No valid token: nothing to describe -> zeros.
    assert torch.equal(masked_whiten(values, torch.zeros(1, 2)), torch.zeros(1, 2))


def test_group_mean_and_count_interleaved():
    # Groups x = rows 0, 2 (1, 3 -> mean 2), y = row 1 (5 -> mean 5).
    mean, count = group_mean_and_count(torch.tensor([1.0, 5.0, 3.0]), ["x", "y", "x"])
    assert mean.tolist() == [2.0, 5.0, 2.0]
    assert count.tolist() == [2.0, 1.0, 2.0]


def test_group_logavgexp_hand_example():
    # Group x: rewards 0, ln 3 with tau 1 -> log((1 + 3) / 2) = ln 2; group y alone -> itself.
    scores = torch.tensor([0.0, 7.0, math.log(3.0)])
    out = group_logavgexp(scores, ["x", "y", "x"], tau=1.0)
    assert torch.allclose(out, torch.tensor([math.log(2.0), 7.0, math.log(2.0)]))


def test_discounted_returns_skip_masked_tokens():
    # gamma 0.5, rewards [1, 9, 2, 0 (padding)], mask [1, 0, 1, 0]:
    # G2 = 2; the masked t=1 adds nothing and does not discount; G0 = 1 + 0.5 * 2 = 2.
    rewards = torch.tensor([[1.0, 9.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert discounted_returns(rewards, mask, 0.5).tolist() == [[2.0, 0.0, 2.0, 0.0]]
