"""ReMax advantages: reward minus the greedy response's reward, worked by hand."""

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.remax import REMAXAdvantageFn
from trinity.common.experience import Experience, ExperienceBatch


def make_batch(rewards, baselines, masks):
    """One row per reward; ``baselines[i]`` goes to ``info["baseline_reward"]`` unless None."""
    exps = []
    for r, b, m in zip(rewards, baselines, masks, strict=True):
        info = {} if b is None else {"baseline_reward": b}
        exps.append(
            Experience(
                tokens=[1, 2] + [3] * len(m), prompt_length=2, reward=r, action_mask=m, info=info
            )
        )
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_remax_subtracts_the_greedy_reward_and_broadcasts():
    # A = r - r_greedy: 1 - 0.5 = 0.5, 0 - 0.5 = -0.5, 0.5 - 1 = -0.5.
    # Row 0 has 2 action tokens, row 1 one (padded), row 2 an environment token first.
    batch = make_batch([1.0, 0.0, 0.5], [0.5, 0.5, 1.0], [[1, 1], [1], [0, 1]])
    exps, metrics = ADVANTAGE_FN.get("remax")()(batch)
    expected = torch.tensor([[0.5, 0.5], [-0.5, 0.0], [0.0, -0.5]])
    assert torch.allclose(exps.advantages, expected)
    assert torch.equal(exps.returns, exps.advantages)
    # 4 valid tokens: (0.5 + 0.5 - 0.5 - 0.5) / 4 = 0
    assert metrics["critic/advantages/mean"] == pytest.approx(0.0)
    assert metrics["critic/score/mean"] == pytest.approx(0.5)


def test_remax_uses_token_level_rewards_when_set():
    # Token rewards [-0.1, 0.9] sum to 0.8; greedy reward 0.5 -> A = 0.3 on both tokens.
    batch = make_batch([1.0], [0.5], [[1, 1]])
    batch.token_level_rewards = torch.tensor([[-0.1, 0.9]])
    exps, _ = REMAXAdvantageFn()(batch)
    assert torch.allclose(exps.advantages, torch.tensor([[0.3, 0.3]]))


def test_remax_names_the_missing_baseline():
    batch = make_batch([1.0, 0.0], [0.5, None], [[1], [1]])
    with pytest.raises(ValueError, match=r"info\['baseline_reward'\].*experience 1"):
        REMAXAdvantageFn()(batch)


def test_registry_and_defaults():
    assert ADVANTAGE_FN.get("remax") is REMAXAdvantageFn
    assert REMAXAdvantageFn.default_args() == {}
