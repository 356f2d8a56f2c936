"""DPO loss on two hand-computed (chosen, rejected) pairs."""

import math

import pytest
import torch

import trinity.algorithm.policy_loss_fn.dpo  # noqa: F401  (registers "dpo")
from trinity.algorithm import POLICY_LOSS_FN

# Rows: [chosen_0, rejected_0, chosen_1, rejected_1]; row 1's second token is padding
# (its logprob -9 must be ignored). Sequence log-ratios sum(logprob - ref) over valid tokens:
#   chosen_0:   (-1 - -2) + (-1 - -1) = 1
#   rejected_0: (-2 - -1)             = -1
#   chosen_1:   0 + 0                 = 0
#   rejected_1: 0.5 + 0.5             = 1
# beta = 0.5: rewards chosen [0.5, 0], rejected [-0.5, 0.5]; beta * margin z = [1, -0.5].
LOGPROB = torch.tensor([[-1.0, -1.0], [-2.0, -9.0], [-1.0, -1.0], [-1.0, -1.0]])
REF = torch.tensor([[-2.0, -1.0], [-1.0, 0.0], [-1.0, -1.0], [-1.5, -1.5]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))  # -logsigmoid(-x)


def dpo(**kwargs):
    return POLICY_LOSS_FN.get("dpo")(**kwargs)


def test_dpo_loss_and_metrics():
    loss, metrics = dpo(beta=0.5)(logprob=LOGPROB, ref_logprob=REF, action_mask=MASK)
    # -logsigmoid(z) = softplus(-z): pairs give softplus(-1) and softplus(0.5).
    expected = (softplus(-1.0) + softplus(0.5)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["dpo_loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["chosen_reward"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert metrics["rejected_reward"] == pytest.approx(0.0)  # (-0.5 + 0.5) / 2
    assert metrics["reward_accuracy"] == pytest.approx(0.5)  # only pair 0 prefers chosen
    assert metrics["reward_margin"] == pytest.approx(0.25)  # (1 - 0.5) / 2


def test_dpo_label_smoothing():
    loss, _ = dpo(beta=0.5, label_smoothing=0.1)(logprob=LOGPROB, ref_logprob=REF, action_mask=MASK)
    # 0.9 * -logsigmoid(z) + 0.1 * -logsigmoid(-z) = 0.9 softplus(-z) + 0.1 softplus(z)
    pair0 = 0.9 * softplus(-1.0) + 0.1 * softplus(1.0)
    pair1 = 0.9 * softplus(0.5) + 0.1 * softplus(-0.5)
    assert loss.item() == pytest.approx((pair0 + pair1) / 2, abs=1e-6)


def test_dpo_gradient():
    logprob = LOGPROB.clone().requires_grad_()
    loss, _ = dpo(beta=0.5)(logprob=logprob, ref_logprob=REF, action_mask=MASK)
    loss.backward()
    # d softplus(-z) / dz = -sigmoid(-z); dz/d chosen token = beta, d rejected token = -beta;
    # mean over 2 pairs halves it. Padding gets 0.
    s0 = 1 / (1 + math.exp(1.0))  # sigmoid(-1)
    s1 = 1 / (1 + math.exp(-0.5))  # sigmoid(0.5)
    g0, g1 = 0.5 * s0 / 2, 0.5 * s1 / 2
    expected = torch.tensor([[-g0, -g0], [g0, 0.0], [-g1, -g1], [g1, g1]])
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_dpo_rejects_odd_rows_and_missing_reference():
    fn = dpo()
    with pytest.raises(ValueError, match="pairs"):
        fn(logprob=LOGPROB[:3], ref_logprob=REF[:3], action_mask=MASK[:3])
    with pytest.raises(ValueError, match="reference"):
        fn(logprob=LOGPROB, ref_logprob=None, action_mask=MASK)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo(label_smoothing=0.7)


def test_dpo_args_and_keys():
    cls = POLICY_LOSS_FN.get("dpo")
    assert cls.default_args() == {
        "beta": 0.1,
        "label_smoothing": 0.0,
        "loss_agg_mode": "seq-mean-token-mean",
    }
    assert cls.select_keys == ("logprob", "ref_logprob", "action_mask")
