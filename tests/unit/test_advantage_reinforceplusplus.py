"""REINFORCE++ advantages: discounted returns whitened over the batch, worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.reinforce_plus_plus import REINFORCEPlusPlusAdvantageFn
from trinity.common.experience import Experience, ExperienceBatch


def make_batch(rewards, masks):
    """One row per reward: a 2-token prompt and a response as long as its mask."""
    exps = [
        Experience(tokens=[1, 2] + [3] * len(m), prompt_length=2, reward=r, action_mask=m)
        for r, m in zip(rewards, masks, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_discounted_returns_whitened_over_valid_tokens():
    # gamma = 0.5; the scalar reward sits on the last action token.
    # Row 0 (3 tokens, reward 1):  G = [0.25, 0.5, 1.0]
    # Row 1 (2 tokens + padding, reward -1): G = [-0.5, -1.0, 0 (padding)]
    # Valid G: 0.25, 0.5, 1, -0.5, -1 -> mean 0.25 / 5 = 0.05
    # deviations 0.2, 0.45, 0.95, -0.55, -1.05; squares sum to
    # 0.04 + 0.2025 + 0.9025 + 0.3025 + 1.1025 = 2.55 -> unbiased var 2.55 / 4 = 0.6375
    fn = REINFORCEPlusPlusAdvantageFn(gamma=0.5)
    exps, metrics = fn(make_batch([1.0, -1.0], [[1, 1, 1], [1, 1]]))
    assert torch.allclose(exps.returns, torch.tensor([[0.25, 0.5, 1.0], [-0.5, -1.0, 0.0]]))
    scale = 1 / math.sqrt(0.6375 + 1e-8)
    expected = torch.tensor([[0.2, 0.45, 0.95], [-0.55, -1.05, 0.0]]) * scale
    assert torch.allclose(exps.advantages, expected, atol=1e-5)
    assert metrics["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["critic/returns/max"] == pytest.approx(1.0)


def test_token_level_rewards_with_kl_penalty_default_gamma():
    # gamma = 1 (default): every token carries -0.1 (KL), the last also the reward 0.9.
    # G = [-0.1 - 0.1 + 0.8, -0.1 + 0.8, 0.8] = [0.6, 0.7, 0.8]; mean 0.7,
    # deviations -0.1, 0, 0.1, unbiased var (0.01 + 0.01) / 2 = 0.01 -> advantages -1, 0, 1.
    batch = make_batch([0.0], [[1, 1, 1]])
    batch.token_level_rewards = torch.tensor([[-0.1, -0.1, 0.8]])
    exps, _ = ADVANTAGE_FN.get("reinforceplusplus")()(batch)
    assert torch.allclose(exps.returns, torch.tensor([[0.6, 0.7, 0.8]]), atol=1e-6)
    assert torch.allclose(exps.advantages, torch.tensor([[-1.0, 0.0, 1.0]]), atol=1e-4)


def test_environment_tokens_are_not_steps():
    # Mask [1, 0, 1], gamma 0.5, token rewards [0, 5, 1]: the masked token's reward is
    # ignored and it does not discount: G2 = 1, G0 = 0 + 0.5 * 1 = 0.5, G1 = 0 (masked).
    # Whitening two tokens: mean 0.75, deviations -0.25, 0.25, var 0.125 / 1.
    batch = make_batch([0.0], [[1, 0, 1]])
    batch.token_level_rewards = torch.tensor([[0.0, 5.0, 1.0]])
    exps, _ = REINFORCEPlusPlusAdvantageFn(gamma=0.5)(batch)
    assert torch.allclose(exps.returns, torch.tensor([[0.5, 0.0, 1.0]]))
    a = 0.25 / math.sqrt(0.125 + 1e-8)
    assert torch.allclose(exps.advantages, torch.tensor([[-a, 0.0, a]]), atol=1e-5)


def test_registry_and_defaults():
    assert ADVANTAGE_FN.get("reinforceplusplus") is REINFORCEPlusPlusAdvantageFn
    assert REINFORCEPlusPlusAdvantageFn.default_args() == {"gamma": 1.0}
