"""TOPR: plain REINFORCE on positive sequences, truncated sequence IS on negative ones,
worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN

ln = math.log
# old_logprob = 0, so each token's ratio r = exp(logprob) and logprob = ln r.
# Row 0: A = +1, r = [2.0, 0.5]      -> w = 1 (positive: no weight, even though pi/mu = 1)
# Row 1: A = -2, r = [0.5, 0.8]      -> pi/mu = 0.4 -> w = 0.4
# Row 2: A = -1, r = [2.0, 3.0, pad] -> pi/mu = 6 (padding not counted) -> w = clip = 1
RATIOS = torch.tensor([[2.0, 0.5, 1.0], [0.5, 0.8, 1.0], [2.0, 3.0, 9.0]])
OLD = torch.zeros(3, 3)
ADV = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
# per-token loss -w * A * ln r
ROW0 = -(ln(2.0) + ln(0.5))  # = 0
ROW1 = 0.4 * 2.0 * (ln(0.5) + ln(0.8))
ROW2 = 1.0 * 1.0 * (ln(2.0) + ln(3.0))
EXPECTED = {
    "token-mean": (ROW0 + ROW1 + ROW2) / 6,
    "seq-mean-token-mean": (ROW0 / 2 + ROW1 / 2 + ROW2 / 2) / 3,
    "seq-mean-token-sum": (ROW0 + ROW1 + ROW2) / 3,
}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_topr_loss_by_hand(mode):
    fn = POLICY_LOSS_FN.get("topr")(loss_agg_mode=mode)
    loss, metrics = fn(logprob=RATIOS.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["tapered_frac"] == pytest.approx(1 / 3)  # row 1 only


def test_gradient_of_a_negative_sequence_is_scaled_by_its_truncated_ratio():
    logprob = RATIOS.log().clone().requires_grad_(True)
    fn = POLICY_LOSS_FN.get("topr")(loss_agg_mode="seq-mean-token-sum")
    loss, _ = fn(logprob=logprob, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    loss.backward()
    # d loss / d logprob = -w * A / B on valid tokens: the weight itself is not differentiated
    expected = torch.tensor([[-1.0, -1.0, 0.0], [0.8, 0.8, 0.0], [1.0, 1.0, 0.0]]) / 3
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_on_policy_it_is_reinforce_and_far_off_policy_it_stays_finite():
    fn = POLICY_LOSS_FN.get("topr")(loss_agg_mode="token-mean")
    logprob = torch.tensor([[-1.0, -2.0]])
    on, _ = fn(logprob=logprob, old_logprob=logprob, action_mask=torch.ones(1, 2),
               advantages=torch.full((1, 2), -1.0))  # fmt: skip
    assert on.item() == pytest.approx((-1.0 - 2.0) / 2)  # w = 1: -(-1) * logprob, mean
    far, _ = fn(logprob=logprob, old_logprob=logprob - 500.0, action_mask=torch.ones(1, 2),
                advantages=torch.full((1, 2), -1.0))  # fmt: skip
    assert math.isfinite(far.item())


def test_topr_algorithm_type_defaults():
    config = ALGORITHM_TYPE.get("topr").default_config()
    assert config["policy_loss_fn"] == "topr" and config["kl_loss_fn"] == "none"
