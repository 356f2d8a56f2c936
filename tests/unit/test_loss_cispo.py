"""CISPO: clipped stop-gradient IS weight times REINFORCE, worked by hand."""

import math

import pytest
import torch

import trinity.algorithm.policy_loss_fn.cispo  # noqa: F401  (registers "cispo")
from trinity.algorithm import POLICY_LOSS_FN

# old_logprob = 0, so ratio r = exp(logprob) and logprob = log r.
# Row 0: A = +1, r = [1.5, 0.7, 1.1]; row 1: A = -2, r = [0.5, 1.0, 3.0], last token padding.
# Defaults (no lower bound, upper 1.28): weights row 0 [1.28, 0.7, 1.1], row 1 [0.5, 1.0, -].
# Per-token loss -w * A * log r:
#   row 0: [-1.28 ln1.5, -0.7 ln0.7, -1.1 ln1.1]; row 1: [2 * 0.5 ln0.5, 2 * 1.0 ln1.0 = 0].
RATIOS = torch.tensor([[1.5, 0.7, 1.1], [0.5, 1.0, 3.0]])
OLD = torch.zeros(2, 3)
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ln = math.log
ROW0 = -1.28 * ln(1.5) - 0.7 * ln(0.7) - 1.1 * ln(1.1)
ROW1 = 1.0 * ln(0.5)
EXPECTED = {
    "token-mean": (ROW0 + ROW1) / 5,
    "seq-mean-token-mean": (ROW0 / 3 + ROW1 / 2) / 2,
    "seq-mean-token-sum": (ROW0 + ROW1) / 2,
}


def cispo(**kwargs):
    return POLICY_LOSS_FN.get("cispo")(**kwargs)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_cispo_default_bounds(mode):
    fn = cispo(loss_agg_mode=mode)
    loss, metrics = fn(logprob=RATIOS.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(EXPECTED[mode], abs=1e-6)
    # Only row 0 token 0 (1.5 -> 1.28) among valid tokens; row 1's padded 3.0 does not count.
    assert metrics["is_clipfrac"] == pytest.approx(1 / 5)


def test_cispo_lower_bound():
    # clip_range_low 0.2: row 0 token 1 (0.7 -> 0.8) and row 1 token 0 (0.5 -> 0.8) clipped too.
    fn = cispo(clip_range_low=0.2)
    loss, metrics = fn(logprob=RATIOS.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV)
    row0 = -1.28 * ln(1.5) - 0.8 * ln(0.7) - 1.1 * ln(1.1)
    row1 = 2 * 0.8 * ln(0.5)
    assert loss.item() == pytest.approx((row0 + row1) / 5, abs=1e-6)
    assert metrics["is_clipfrac"] == pytest.approx(3 / 5)


def test_cispo_gradient_kept_on_clipped_tokens():
    logprob = RATIOS.log().requires_grad_()
    loss, _ = cispo()(logprob=logprob, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    loss.backward()
    # The weight is a constant: d/dlogprob = -w * A / 5 tokens, also on the clipped token
    # (where PPO's gradient would be 0); padding gets 0.
    expected = torch.tensor([[-1.28, -0.7, -1.1], [2 * 0.5, 2 * 1.0, 0.0]]) / 5
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_cispo_defaults():
    cls = POLICY_LOSS_FN.get("cispo")
    assert cls.default_args() == {
        "clip_range_low": None,
        "clip_range_high": 0.28,
        "loss_agg_mode": "token-mean",
    }
    assert cls.select_keys == POLICY_LOSS_FN.get("ppo").select_keys  # rollout_is_weights too
    with pytest.raises(ValueError, match="clip_range_high"):
        cls(clip_range_high=-0.1)
