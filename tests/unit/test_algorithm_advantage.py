"""GRPO advantages on hand-made groups."""

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.common.experience import Experience, ExperienceBatch

EPS = 1e-6


def make_batch(rewards, group_ids, action_masks):
    """One experience per row: a 2-token prompt and a response as long as its mask."""
    exps = [
        Experience(
            tokens=[1, 2] + [3] * len(m),
            prompt_length=2,
            reward=r,
            action_mask=m,
            group_id=g,
        )
        for r, g, m in zip(rewards, group_ids, action_masks, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


# Groups interleaved on purpose: a = rows 0, 2, 4 with rewards 1, 2, 3; b = rows 1, 3: 0, 1.
# Group a: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> advantages -1, 0, 1 (/ (1 + eps)).
# Group b: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) -> -/+ 0.5 / sqrt(0.5).
REWARDS = [1.0, 0.0, 2.0, 1.0, 3.0]
GROUPS = ["a", "b", "a", "b", "a"]
# Responses of length 3, 2, 3, 1, 2 -> R = 3; row 0 has an environment token in the middle.
MASKS = [[1, 0, 1], [1, 1], [1, 1, 1], [1], [1, 1]]
B_ADV = 0.5 / (math.sqrt(0.5) + EPS)


def expected_token_advantages(seq_adv):
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float)
    return torch.tensor(seq_adv).unsqueeze(-1) * mask


def test_grpo_two_groups_with_padding():
    fn = ADVANTAGE_FN.get("grpo")(**ADVANTAGE_FN.get("grpo").default_args())
    exps, metrics = fn(make_batch(REWARDS, GROUPS, MASKS))
    seq_adv = [-1 / (1 + EPS), -B_ADV, 0.0, B_ADV, 1 / (1 + EPS)]
    expected = expected_token_advantages(seq_adv)
    assert torch.allclose(exps.advantages, expected, atol=1e-5)
    assert torch.equal(exps.returns, exps.advantages)
    # Valid tokens: row0 2x(-1), row1 2x(-0.707), row2 3x0, row3 1x(0.707), row4 2x(1).
    assert metrics["critic/advantages/max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["critic/advantages/min"] == pytest.approx(-1.0, abs=1e-5)
    assert metrics["critic/advantages/mean"] == pytest.approx((-B_ADV) / 10, abs=1e-5)
    assert metrics["critic/score/mean"] == pytest.approx(7.0 / 5.0)
    assert "critic/returns/mean" in metrics


def test_grpo_without_std_is_mean_centered_only():
    fn = ADVANTAGE_FN.get("grpo")(norm_adv_by_std_in_grpo=False)
    exps, _ = fn(make_batch(REWARDS, GROUPS, MASKS))
    # a: 1-2, 2-2, 3-2; b: 0-0.5, 1-0.5
    expected = expected_token_advantages([-1.0, -0.5, 0.0, 0.5, 1.0])
    assert torch.allclose(exps.advantages, expected)


def test_grpo_single_and_constant_groups_get_zero():
    # Group c has one row (no baseline); group d has equal rewards (std 0 -> 0 / eps = 0).
    fn = ADVANTAGE_FN.get("grpo")()
    exps, _ = fn(make_batch([5.0, 1.0, 1.0], ["c", "d", "d"], [[1, 1], [1], [1, 1]]))
    assert torch.equal(exps.advantages, torch.zeros(3, 2))


def test_grpo_uses_token_level_rewards_when_set():
    # Rewards 0 and 0, but token-level rewards summing to 1 and 3: mean 2, std sqrt(2).
    batch = make_batch([0.0, 0.0], ["g", "g"], [[1, 1], [1, 1]])
    batch.token_level_rewards = torch.tensor([[0.5, 0.5], [0.0, 3.0]])
    exps, metrics = ADVANTAGE_FN.get("grpo")()(batch)
    adv = 1 / (math.sqrt(2) + EPS)
    assert torch.allclose(exps.advantages, torch.tensor([[-adv, -adv], [adv, adv]]))
    assert metrics["critic/rewards/mean"] == pytest.approx(2.0)
    assert metrics["critic/score/mean"] == pytest.approx(0.0)


def test_grpo_refuses_missing_group_ids():
    with pytest.raises(ValueError, match="group_id"):
        ADVANTAGE_FN.get("grpo")()(make_batch([1.0, 0.0], ["", ""], [[1], [1]]))


def test_registry_and_base_class():
    assert ADVANTAGE_FN.get("grpo").default_args() == {
        "epsilon": 1e-6,
        "norm_adv_by_std_in_grpo": True,
        "std_threshold": None,
    }
    assert issubclass(ADVANTAGE_FN.get("grpo"), AdvantageFn)
