"""SAPO: the soft gate's value and gradient, worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def sapo(logprob, advantages, mask, **kwargs):
    fn = POLICY_LOSS_FN.get("sapo")(**kwargs)
    old = torch.zeros_like(logprob)  # so r = exp(logprob)
    return fn(logprob=logprob, old_logprob=old, action_mask=mask, advantages=advantages)


def test_sapo_loss_and_gradient_by_hand():
    # Row 0: A = +1 (tau_pos = 1), r = [1.5, 1.0]; row 1: A = -1 (tau_neg = 1.05),
    # r = [0.5, pad]. seq-mean-token-mean: each row's token mean, then the mean of rows.
    ratios = torch.tensor([[1.5, 1.0], [0.5, 1.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logprob = ratios.log().requires_grad_()
    loss, metrics = sapo(logprob, adv, mask)

    def f(r, tau):  # the soft gate sigma(tau (r - 1)) * 4 / tau
        return sigmoid(tau * (r - 1)) * 4 / tau

    row0 = -(f(1.5, 1.0) + f(1.0, 1.0)) / 2
    row1 = f(0.5, 1.05)
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    loss.backward()

    def w(r, tau):  # d f(r) / d log pi = 4 p (1 - p) * r
        p = sigmoid(tau * (r - 1))
        return 4 * p * (1 - p)

    expected = torch.tensor(
        [[-w(1.5, 1.0) * 1.5 / 4, -w(1.0, 1.0) * 1.0 / 4], [w(0.5, 1.05) * 0.5 / 2, 0.0]]
    )
    assert torch.allclose(logprob.grad, expected, atol=1e-6)
    assert metrics["soft_gate"] == pytest.approx((w(1.5, 1) + w(1.0, 1) + w(0.5, 1.05)) / 3)


def test_on_policy_the_gate_passes_the_policy_gradient_and_far_off_it_fades():
    logprob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0]])
    # r = 1: the gradient weight 4 p (1 - p) is exactly 1 at p = sigmoid(0)
    shifted = POLICY_LOSS_FN.get("sapo")(loss_agg_mode="token-mean")
    on, _ = shifted(logprob=logprob, old_logprob=logprob.detach(), action_mask=torch.ones(1, 2),
                    advantages=adv)  # fmt: skip
    on.backward()
    assert torch.allclose(logprob.grad, torch.full((1, 2), -2.0 / 2))
    # r = e^8 (far off-policy): the gate has saturated, so the token's gradient is (about) 0
    # and its loss finite, as PPO's clip would give, but reached smoothly
    far = torch.tensor([[8.0]], requires_grad=True)
    far_loss, _ = shifted(logprob=far, old_logprob=torch.zeros(1, 1), action_mask=torch.ones(1, 1),
                          advantages=torch.ones(1, 1))  # fmt: skip
    far_loss.backward()
    assert math.isfinite(far_loss.item()) and -1e-6 < far.grad.item() <= 0


def test_sapo_checks_temperatures_and_defaults():
    with pytest.raises(ValueError, match="tau"):
        POLICY_LOSS_FN.get("sapo")(tau_neg=0.0)
    args = POLICY_LOSS_FN.get("sapo").default_args()
    assert (args["tau_pos"], args["tau_neg"]) == (1.0, 1.05)  # the paper's
    assert ALGORITHM_TYPE.get("sapo").default_config()["policy_loss_fn"] == "sapo"
