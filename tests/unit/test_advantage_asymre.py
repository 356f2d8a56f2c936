"""AsymRE: r - (group mean + baseline_shift), and its loss, on hand-made groups."""

import pytest
import torch

from tests.unit.test_advantage_rloo import make_batch
from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN


def test_asymre_advantages_by_hand():
    # Group a: rewards 1, 0, 0, 1 (mean 0.5) -> V = 0.5 - 0.1 = 0.4 -> 0.6, -0.4, -0.4, 0.6
    # Group b: rewards 0, 0 (mean 0)         -> V = -0.1       -> 0.1, 0.1 (all equal: still
    #   a small push up, the asymmetry the paper wants; GRPO would give 0)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    groups = ["a", "a", "a", "a", "b", "b"]
    masks = [[1, 1], [1], [1, 0, 1], [1, 1], [1], [1, 1]]
    exps, _ = ADVANTAGE_FN.get("asymre")()(make_batch(rewards, groups, masks))
    expected = torch.tensor(
        [
            [0.6, 0.6, 0.0],
            [-0.4, 0.0, 0.0],
            [-0.4, 0.0, -0.4],
            [0.6, 0.6, 0.0],
            [0.1, 0.0, 0.0],
            [0.1, 0.1, 0.0],
        ]
    )
    assert torch.allclose(exps.advantages, expected, atol=1e-6)
    assert torch.equal(exps.returns, exps.advantages)


def test_a_zero_shift_is_the_plain_group_baseline():
    exps, _ = ADVANTAGE_FN.get("asymre")(baseline_shift=0.0)(
        make_batch([2.0, 0.0], ["g", "g"], [[1], [1]])
    )
    assert exps.advantages[:, 0].tolist() == pytest.approx([1.0, -1.0])


def test_asymre_loss_is_the_sequence_log_likelihood_weighted_by_the_advantage():
    config = ALGORITHM_TYPE.get("asymre").default_config()
    assert (config["advantage_fn"], config["policy_loss_fn"]) == ("asymre", "opmd")
    loss_fn = POLICY_LOSS_FN.get("opmd")(
        **config["policy_loss_fn_args"], loss_agg_mode=config["loss_agg_mode"]
    )
    logprob = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([[0.6, 0.6], [-0.4, 0.0]])
    loss, _ = loss_fn(logprob=logprob, action_mask=mask, advantages=advantages)
    # -(A_i * log pi(y_i)), log pi summed over each sequence, mean over sequences:
    # row 0: -0.6 * (-3) = 1.8; row 1: 0.4 * (-0.5) = -0.2; mean 0.8
    assert loss.item() == pytest.approx(0.8)
