"""OPMD policy loss against a hand-computed 2x3 example, in every loss_agg_mode."""

import pytest
import torch

import trinity.algorithm.policy_loss_fn.opmd  # noqa: F401  (registers "opmd")
from trinity.algorithm import POLICY_LOSS_FN

# Row 0: A = +1, logprob [-1, -2, -3], all valid   -> -A * logprob = [1, 2, 3]   (sum 6)
# Row 1: A = -1, logprob [-0.5, -1.5, -4], last token padding
#                                                  -> -A * logprob = [-0.5, -1.5] (sum -2)
LOGPROB = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -4.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# Aggregates before the 1 / (1 + tau) factor:
AGG = {
    "token-mean": 0.8,  # (6 - 2) / 5 tokens
    "seq-mean-token-sum": 2.0,  # (6 - 2) / 2 rows
    "seq-mean-token-mean": 0.5,  # (6/3 + -2/2) / 2 rows
    "seq-mean-token-sum-norm": 2.0 / 3.0,  # (6/3 + -2/3) / 2 rows (norm = R = 3)
}


def opmd(**kwargs):
    return POLICY_LOSS_FN.get("opmd")(**kwargs)


@pytest.mark.parametrize("mode", list(AGG))
def test_opmd_each_mode_divided_by_one_plus_tau(mode):
    # Default tau = 1: the aggregate is halved.
    loss, metrics = opmd(loss_agg_mode=mode)(logprob=LOGPROB, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx(AGG[mode] / 2, abs=1e-6)
    assert metrics["opmd_loss"] == pytest.approx(AGG[mode] / 2, abs=1e-6)
    assert metrics["pg_loss"] == metrics["opmd_loss"]


def test_opmd_tau_and_gradient():
    logprob = LOGPROB.clone().requires_grad_()
    loss, _ = opmd(tau=0.5)(logprob=logprob, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx(0.8 / 1.5, abs=1e-6)
    loss.backward()
    # token-mean over 5 tokens: d loss / d logprob = -A / (5 * 1.5) on valid tokens, 0 on padding.
    g = 1.0 / 7.5
    expected = torch.tensor([[-g, -g, -g], [g, g, 0.0]])
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_opmd_args_and_keys():
    cls = POLICY_LOSS_FN.get("opmd")
    assert cls.default_args() == {"tau": 1.0, "loss_agg_mode": "token-mean"}
    assert cls.select_keys == ("logprob", "action_mask", "advantages", "rollout_is_weights")
    with pytest.raises(ValueError, match="tau"):
        cls(tau=-1.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        cls(loss_agg_mode="bogus")
