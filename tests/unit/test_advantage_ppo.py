"""GAE ("ppo") advantages on hand-worked batches."""

import math
import statistics

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.ppo import PPOAdvantageFn
from trinity.common.experience import Experience, ExperienceBatch

NAN = float("nan")


def make_batch(rewards, masks, values):
    """One row per reward: a 2-token prompt and a response as long as its mask."""
    exps = [
        Experience(tokens=[1, 2] + [3] * len(m), prompt_length=2, reward=r, action_mask=m)
        for r, m in zip(rewards, masks, strict=True)
    ]
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    batch.extra["values"] = torch.tensor(values)
    return batch


# gamma = 0.9, lam = 0.8 (gamma * lam = 0.72); the scalar reward sits on the last action token.
# Row 0: 3 tokens, V = [0.5, 0.2, 0.4], reward 1.
#   t=2: delta = 1 + 0 - 0.4 = 0.6                   A2 = 0.6
#   t=1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16          A1 = 0.16 + 0.72 * 0.6 = 0.592
#   t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32         A0 = -0.32 + 0.72 * 0.592 = 0.10624
#   returns = A + V = [0.60624, 0.792, 1.0]
# Row 1: 2 tokens + 1 padded column whose value is NaN (must not leak), V = [0.3, -0.1], reward -1.
#   t=1: delta = -1 + 0 + 0.1 = -0.9                 A1 = -0.9
#   t=0: delta = 0 + 0.9 * -0.1 - 0.3 = -0.39        A0 = -0.39 + 0.72 * -0.9 = -1.038
#   returns = [-0.738, -1.0, 0 (padding)]
REWARDS = [1.0, -1.0]
MASKS = [[1, 1, 1], [1, 1]]
VALUES = [[0.5, 0.2, 0.4], [0.3, -0.1, NAN]]
RAW_ADV = [[0.10624, 0.592, 0.6], [-1.038, -0.9, 0.0]]
RETURNS = [[0.60624, 0.792, 1.0], [-0.738, -1.0, 0.0]]


def test_gae_without_whitening_two_rows_with_padding():
    fn = PPOAdvantageFn(gamma=0.9, lam=0.8, whiten_advantages=False)
    exps, metrics = fn(make_batch(REWARDS, MASKS, VALUES))
    assert torch.allclose(exps.advantages, torch.tensor(RAW_ADV), atol=1e-6)
    assert torch.allclose(exps.returns, torch.tensor(RETURNS), atol=1e-6)
    assert metrics["critic/returns/max"] == pytest.approx(1.0)
    assert metrics["critic/advantages/min"] == pytest.approx(-1.038)


def test_gae_whitens_over_valid_tokens_only():
    fn = ADVANTAGE_FN.get("ppo")(gamma=0.9, lam=0.8)  # whiten_advantages defaults to True
    exps, metrics = fn(make_batch(REWARDS, MASKS, VALUES))
    # The 5 valid advantages; the padded column is not part of the statistics.
    valid = [0.10624, 0.592, 0.6, -1.038, -0.9]
    mean = statistics.mean(valid)  # -0.127952
    var = statistics.variance(valid)  # unbiased (n - 1 = 4), as veRL's masked_whiten
    scale = 1 / math.sqrt(var + 1e-8)
    expected = [[(a - mean) * scale for a in valid[:3]], [(a - mean) * scale for a in valid[3:]]]
    expected[1].append(0.0)
    assert torch.allclose(exps.advantages, torch.tensor(expected), atol=1e-5)
    # Returns keep the raw A + V (the critic's target), not the whitened advantages.
    assert torch.allclose(exps.returns, torch.tensor(RETURNS), atol=1e-6)
    assert metrics["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-6)


def test_gae_skips_environment_tokens_inside_the_response():
    # Mask [1, 0, 1]: the middle token came from the environment, its value is NaN.
    # Only the two action tokens are steps, so this is row 0 with the middle column removed:
    #   t=2: A2 = 1 - 0.4 = 0.6; the masked t=1 passes V=0.4 and A=0.6 through unchanged
    #   t=0: delta = 0.9 * 0.4 - 0.5 = -0.14, A0 = -0.14 + 0.72 * 0.6 = 0.292
    #   returns = [0.292 + 0.5, 0, 0.6 + 0.4] = [0.792, 0, 1.0]
    fn = PPOAdvantageFn(gamma=0.9, lam=0.8, whiten_advantages=False)
    exps, _ = fn(make_batch([1.0], [[1, 0, 1]], [[0.5, NAN, 0.4]]))
    assert torch.allclose(exps.advantages, torch.tensor([[0.292, 0.0, 0.6]]), atol=1e-6)
    assert torch.allclose(exps.returns, torch.tensor([[0.792, 0.0, 1.0]]), atol=1e-6)


def test_gae_uses_token_level_rewards_when_set():
    # gamma = lam = 1, rewards [-0.1, 0.9] (an in-reward KL penalty), V = [0.2, 0.5]:
    #   t=1: delta = 0.9 - 0.5 = 0.4, A1 = 0.4; t=0: delta = -0.1 + 0.5 - 0.2 = 0.2, A0 = 0.6
    #   returns = [0.8, 0.9]: with gamma = lam = 1 they telescope to the reward-to-go.
    batch = make_batch([123.0], [[1, 1]], [[0.2, 0.5]])  # the scalar reward must be ignored
    batch.token_level_rewards = torch.tensor([[-0.1, 0.9]])
    exps, metrics = PPOAdvantageFn(whiten_advantages=False)(batch)
    assert torch.allclose(exps.advantages, torch.tensor([[0.6, 0.4]]), atol=1e-6)
    assert torch.allclose(exps.returns, torch.tensor([[0.8, 0.9]]), atol=1e-6)
    assert metrics["critic/rewards/mean"] == pytest.approx(0.8)


def test_gae_needs_values_of_the_right_shape():
    batch = make_batch([1.0], [[1, 1]], [[0.0, 0.0]])
    del batch.extra["values"]
    with pytest.raises(ValueError, match=r"extra\['values'\]"):
        PPOAdvantageFn()(batch)
    batch.extra["values"] = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="shape"):
        PPOAdvantageFn()(batch)


def test_registry_and_defaults():
    assert ADVANTAGE_FN.get("ppo") is PPOAdvantageFn
    assert PPOAdvantageFn.default_args() == {"gamma": 1.0, "lam": 1.0, "whiten_advantages": True}
