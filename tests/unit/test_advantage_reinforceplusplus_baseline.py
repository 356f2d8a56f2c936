"""REINFORCE++-baseline advantages: group-centred scores whitened over the batch."""

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.reinforce_plus_plus_baseline import (
    REINFORCEPlusPlusBaselineAdvantageFn,
)
from trinity.common.experience import Experience, ExperienceBatch


def make_batch(rewards, group_ids, masks):
    """One row per reward: a 2-token prompt and a response as long as its mask."""
    exps = [
        Experience(
            tokens=[1, 2] + [3] * len(m), prompt_length=2, reward=r, action_mask=m, group_id=g
        )
        for r, g, m in zip(rewards, group_ids, masks, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_group_centred_then_whitened_over_the_batch():
    # Group a = rows 0, 2 (rewards 1, 3, mean 2) -> -1, +1
    # Group b = rows 1, 3 (rewards 0, 2, mean 1) -> -1, +1
    # Group c = row 4 alone (reward 7) -> centred on itself: 0
    # Broadcast over action tokens (row 2 has an environment token in the middle):
    #   row0 [-1, -1], row1 [-1], row2 [1, -, 1], row3 [1, 1], row4 [0]
    # 8 valid tokens: sum 1 -> mean 0.125; deviations -1.125 (x3), 0.875 (x4), -0.125 (x1)
    # squares: 3 * 1.265625 + 4 * 0.765625 + 0.015625 = 6.875 -> unbiased var 6.875 / 7
    rewards = [1.0, 0.0, 3.0, 2.0, 7.0]
    groups = ["a", "b", "a", "b", "c"]
    masks = [[1, 1], [1], [1, 0, 1], [1, 1], [1]]
    exps, metrics = ADVANTAGE_FN.get("reinforceplusplus_baseline")()(
        make_batch(rewards, groups, masks)
    )
    s = 1 / math.sqrt(6.875 / 7 + 1e-8)
    lo, hi, single = -1.125 * s, 0.875 * s, -0.125 * s
    expected = torch.tensor(
        [
            [lo, lo, 0.0],
            [lo, 0.0, 0.0],
            [hi, 0.0, hi],
            [hi, hi, 0.0],
            [single, 0.0, 0.0],
        ]
    )
    assert torch.allclose(exps.advantages, expected, atol=1e-5)
    assert torch.equal(exps.returns, exps.advantages)
    assert metrics["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-6)


def test_uses_token_level_rewards_when_set():
    # Scores 1 and 3 (sums of token rewards) in one group: centred -1, +1 on 2 tokens each;
    # mean 0, deviations +-1, unbiased var 4 / 3 -> advantages -+ sqrt(3 / 4).
    batch = make_batch([0.0, 0.0], ["g", "g"], [[1, 1], [1, 1]])
    batch.token_level_rewards = torch.tensor([[0.5, 0.5], [0.0, 3.0]])
    exps, _ = REINFORCEPlusPlusBaselineAdvantageFn()(batch)
    a = math.sqrt(3 / 4)
    assert torch.allclose(exps.advantages, torch.tensor([[-a, -a], [a, a]]), atol=1e-5)


def test_refuses_missing_group_ids():
    with pytest.raises(ValueError, match="group_id"):
        REINFORCEPlusPlusBaselineAdvantageFn()(make_batch([1.0, 0.0], ["", ""], [[1], [1]]))


def test_registry_and_defaults():
    cls = ADVANTAGE_FN.get("reinforceplusplus_baseline")
    assert cls is REINFORCEPlusPlusBaselineAdvantageFn
    assert cls.default_args() == {}
