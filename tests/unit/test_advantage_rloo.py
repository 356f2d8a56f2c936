"""RLOO advantages on hand-made groups."""

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.rloo import RLOOAdvantageFn
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


def test_rloo_interleaved_groups_padding_and_a_single_row():
    # Group a = rows 0, 2, 4 with rewards 1, 2, 3 (leave-one-out means 2.5, 2, 1.5):
    #   1 - 2.5 = -1.5, 2 - 2 = 0, 3 - 1.5 = 1.5 (= 3/2 * (r - 2), the closed form)
    # Group b = rows 1, 3 with rewards 0, 1: 0 - 1 = -1, 1 - 0 = 1.
    # Group c = row 5 alone: no other response, so 0.
    # Row 0 has an environment token in the middle (mask 0), rows 1, 3, 4, 5 are padded.
    rewards = [1.0, 0.0, 2.0, 1.0, 3.0, 5.0]
    groups = ["a", "b", "a", "b", "a", "c"]
    masks = [[1, 0, 1], [1, 1], [1, 1, 1], [1], [1, 1], [1]]
    exps, metrics = ADVANTAGE_FN.get("rloo")()(make_batch(rewards, groups, masks))
    expected = torch.tensor(
        [
            [-1.5, 0.0, -1.5],
            [-1.0, -1.0, 0.0],
            [0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0],
            [1.5, 1.5, 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    assert torch.allclose(exps.advantages, expected)
    assert torch.equal(exps.returns, exps.advantages)
    # 11 valid tokens summing to -3 - 2 + 0 + 1 + 3 + 0 = -1.
    assert metrics["critic/advantages/mean"] == pytest.approx(-1 / 11)
    assert metrics["critic/advantages/max"] == pytest.approx(1.5)


def test_rloo_uses_token_level_rewards_when_set():
    # Scalar rewards 0, 0 but token-level rewards summing to 1 and 3: 1 - 3 = -2, 3 - 1 = 2.
    batch = make_batch([0.0, 0.0], ["g", "g"], [[1, 1], [1, 1]])
    batch.token_level_rewards = torch.tensor([[0.5, 0.5], [0.0, 3.0]])
    exps, _ = RLOOAdvantageFn()(batch)
    assert torch.allclose(exps.advantages, torch.tensor([[-2.0, -2.0], [2.0, 2.0]]))


def test_rloo_refuses_missing_group_ids():
    with pytest.raises(ValueError, match="group_id"):
        RLOOAdvantageFn()(make_batch([1.0, 0.0], ["", ""], [[1], [1]]))


def test_registry_and_defaults():
    assert ADVANTAGE_FN.get("rloo") is RLOOAdvantageFn
    assert RLOOAdvantageFn.default_args() == {}
