"""sPPO: A times the clipped log-ratio, worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN

# epsilon 0.3: log r is clipped to [-ln 1.3, ln 1.3] = [-0.2624, 0.2624], i.e. r to
# [0.769, 1.3]. old_logprob = 0, so logprob = ln r.
RATIOS = torch.tensor([[1.2, 1.5, 0.8, 0.7]])
OLD = torch.zeros(1, 4)
MASK = torch.ones(1, 4)


def sppo(logprob, advantage):
    fn = POLICY_LOSS_FN.get("sppo")()
    adv = torch.full((1, 4), advantage)
    return fn(logprob=logprob, old_logprob=OLD, action_mask=MASK, advantages=adv)


@pytest.mark.parametrize("advantage", [2.0, -2.0])
def test_sppo_loss_and_gradient_by_hand(advantage):
    logprob = RATIOS.log().requires_grad_()
    loss, metrics = sppo(logprob, advantage)
    bound = math.log(1.3)
    clipped = [math.log(1.2), bound, math.log(0.8), -bound]  # 1.5 and 0.7 are clipped
    assert loss.item() == pytest.approx(-advantage * sum(clipped) / 4, abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # inside the clip: A * grad log pi (no ratio); outside: nothing, whatever A's sign
    expected = torch.tensor([[-advantage, 0.0, -advantage, 0.0]]) / 4
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_sppo_on_policy_is_reinforce():
    logprob = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    fn = POLICY_LOSS_FN.get("sppo")()
    loss, _ = fn(logprob=logprob, old_logprob=logprob.detach(), action_mask=MASK,
                 advantages=torch.full((1, 4), 1.5))  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(0.0)
    assert torch.allclose(logprob.grad, torch.full((1, 4), -1.5 / 4))


def test_sppo_checks_epsilon_and_defaults():
    with pytest.raises(ValueError, match="epsilon"):
        POLICY_LOSS_FN.get("sppo")(epsilon=0.0)
    config = ALGORITHM_TYPE.get("sppo").default_config()
    assert (config["policy_loss_fn"], config["advantage_fn"]) == ("sppo", "opmd")
