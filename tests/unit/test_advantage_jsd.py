"""JSD distillation: the generalized JSD's per-token advantage and estimate, by hand and
against the exact gradient over a whole vocabulary."""

import math

import pytest
import torch

from tests.unit.test_advantage_rloo import make_batch
from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE
from trinity.algorithm.advantage_fn.jsd import jsd_advantages


def test_one_token_by_hand():
    # teacher P = 0.5, student Q = 0.25, beta 0.5: M = 0.375, M / Q = 1.5
    teacher, student = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    adv, est = jsd_advantages(teacher, student, 0.5)
    assert adv.item() == pytest.approx(0.5 * math.log(1.5))
    # beta (P/Q) log(P/M) + (1 - beta) log(Q/M) = 0.5 * 2 * ln(4/3) + 0.5 * ln(2/3)
    assert est.item() == pytest.approx(math.log(4 / 3) + 0.5 * math.log(2 / 3))


def test_equal_distributions_give_nothing_to_learn():
    lp = torch.tensor([[-0.3, -2.0, -7.0]])
    adv, est = jsd_advantages(lp, lp, 0.3)
    assert torch.allclose(adv, torch.zeros(1, 3), atol=1e-7)
    assert torch.allclose(est, torch.zeros(1, 3), atol=1e-7)


def test_beta_ends_are_the_reverse_and_forward_kl_advantages():
    teacher, student = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    near_one, _ = jsd_advantages(teacher, student, 1 - 1e-4)
    assert near_one.item() / 1e-4 == pytest.approx(math.log(2), rel=1e-3)  # log P - log Q
    near_zero, _ = jsd_advantages(teacher, student, 1e-4)
    assert near_zero.item() / 1e-4 == pytest.approx(2 - 1, rel=1e-3)  # P / Q - 1


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_the_advantage_is_the_policy_gradient_of_the_full_jsd(beta):
    # A 5-token vocabulary: grad of JSD(beta)(P || Q_theta) in the student's logits equals
    # E_{y ~ Q}[-A(y) grad log Q(y)], the expectation of the sampled-token gradient.
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5), -1)
    logits = torch.randn(5, requires_grad=True)
    q = torch.softmax(logits, -1)
    m = beta * p + (1 - beta) * q
    jsd = beta * (p * (p / m).log()).sum() + (1 - beta) * (q * (q / m).log()).sum()
    (exact,) = torch.autograd.grad(jsd, logits)
    adv, est = jsd_advantages(p.log().unsqueeze(0), q.detach().log().unsqueeze(0), beta)
    logq = torch.log_softmax(logits, -1)
    surrogate = -(q.detach() * adv.squeeze(0) * logq).sum()  # sum_y Q(y) * -A(y) log Q(y)
    (policy_gradient,) = torch.autograd.grad(surrogate, logits)
    assert torch.allclose(policy_gradient, exact, atol=1e-6)
    # and the per-token estimate averages to the JSD under Q
    assert (q.detach() * est.squeeze(0)).sum().item() == pytest.approx(jsd.item(), abs=1e-6)


def test_jsd_advantage_fn_on_a_batch():
    exps = make_batch([0.0, 0.0], ["a", "b"], [[1, 1], [1]])
    exps.old_logprob = torch.log(torch.tensor([[0.25, 0.5], [0.25, 1.0]]))
    exps.extra["teacher_logprob"] = torch.log(torch.tensor([[0.5, 0.5], [0.5, 1.0]]))
    exps, metrics = ADVANTAGE_FN.get("jsd")(lambda_coef=0.5, kl_coef=2.0)(exps)
    a = 2.0 * 0.5 * math.log(1.5)  # the first token of each row; the others agree (0)
    assert torch.allclose(exps.advantages, torch.tensor([[a, 0.0], [a, 0.0]]), atol=1e-6)
    one = math.log(4 / 3) + 0.5 * math.log(2 / 3)
    assert metrics["distill/jsd"] == pytest.approx(2 * one / 3, abs=1e-6)  # 3 valid tokens


def test_jsd_needs_a_teacher_and_a_beta_inside_0_1():
    with pytest.raises(ValueError, match="teacher"):
        ADVANTAGE_FN.get("jsd")()(make_batch([0.0], ["a"], [[1]]))
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="lambda_coef"):
            ADVANTAGE_FN.get("jsd")(lambda_coef=bad)
    jsd = ALGORITHM_TYPE.get("jsd")
    assert jsd.use_teacher and not jsd.use_reference
    assert jsd.default_config()["advantage_fn"] == "jsd"
