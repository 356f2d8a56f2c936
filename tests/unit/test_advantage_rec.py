"""REC advantages: r - group mean, optional std, and balancing a group by dropping."""

import pytest
import torch

from tests.unit.test_advantage_rloo import make_batch
from trinity.algorithm import ADVANTAGE_FN


def first_column(**kwargs):
    # Group a: rewards 1, 0, 0, 0 (mean 0.25); group b: 1, 1 (all equal); group c: 1, 0.
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c"]
    exps, metrics = ADVANTAGE_FN.get("rec")(**kwargs)(make_batch(rewards, groups, [[1, 1]] * 8))
    assert torch.equal(exps.advantages[:, 0], exps.advantages[:, 1])  # broadcast over tokens
    return exps.advantages[:, 0].tolist(), metrics


def test_rec_advantage_is_reward_minus_group_mean():
    advantages, metrics = first_column()
    # a: 1 - 0.25, 0 - 0.25 (x3); b: all equal, so 0 (no signal, not NaN); c: +-0.5
    assert advantages == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.5, -0.5])
    assert metrics["rec/dropped_frac"] == 0.0


def test_rec_advantage_divided_by_the_group_std():
    advantages, _ = first_column(std_normalize=True)
    # a: unbiased std of (1, 0, 0, 0) = sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    # c: std of (1, 0) = sqrt(0.5); b: 0 / (0 + eps) = 0
    half = 0.5 / 0.5**0.5
    assert advantages == pytest.approx([1.5, -0.5, -0.5, -0.5, 0, 0, half, -half], abs=1e-5)


def test_balance_drops_the_surplus_below_mean_rows_at_random():
    torch.manual_seed(0)
    advantages, metrics = first_column(drop="balance")
    # a has 3 below-mean rows and 1 other: two are dropped (0), the kept pair (1, 0) has mean
    # 0.5, so +0.5 and -0.5; b and c are balanced already and keep their values.
    assert advantages[0] == pytest.approx(0.5)
    assert sorted(advantages[1:4]) == pytest.approx([-0.5, 0.0, 0.0])
    assert advantages[4:] == pytest.approx([0.0, 0.0, 0.5, -0.5])
    assert metrics["rec/dropped_frac"] == pytest.approx(2 / 8)


def test_rec_advantage_rejects_an_unknown_drop():
    with pytest.raises(ValueError, match="drop"):
        ADVANTAGE_FN.get("rec")(drop="random")
