"""M2PO: the second-moment mask over a batch and the masked loss, worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN
from trinity.algorithm.policy_loss_fn.m2po import second_moment_mask

# old_logprob = 0, so logprob = log r.
# Row 0 (A = +1): log r = [0.1, 0.5, -0.3, 0.0] -> in the trust region's reach (A > 0 and
#   r > 1): 0.1, 0.5.
# Row 1 (A = -1): log r = [-0.2, -0.6, 0.4, pad] -> in reach (A < 0 and r < 1): -0.2, -0.6.
# Squared: 0.01, 0.25, 0.04, 0.36 (mean 0.165 > 0.04). Sorted 0.01, 0.04, 0.25, 0.36, prefix
# means 0.01, 0.025, 0.1, 0.165: the first two stay within 0.04, so 0.5 and -0.6 are masked.
LOG_RATIO = torch.tensor([[0.1, 0.5, -0.3, 0.0], [-0.2, -0.6, 0.4, 0.0]])
ADV = torch.tensor([[1.0] * 4, [-1.0] * 4])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
KEPT = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]])


def test_the_mask_drops_the_largest_squared_log_ratios_until_m2_is_bounded():
    assert torch.equal(second_moment_mask(LOG_RATIO, ADV, MASK, 0.04), KEPT)


@pytest.mark.parametrize(
    "threshold, kept",
    [
        (0.165, MASK),  # M2 is already within the bound: nothing masked
        (0.0, torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])),  # all in reach
    ],
)
def test_mask_bounds(threshold, kept):
    assert torch.equal(second_moment_mask(LOG_RATIO, ADV, MASK, threshold), kept)


def test_tokens_moving_towards_one_and_zero_advantages_are_never_masked():
    # A > 0 with r < 1 and A < 0 with r > 1 (the update brings r back), or A = 0
    log_ratio = torch.tensor([[-3.0, 3.0, 3.0]])
    adv = torch.tensor([[1.0, -1.0, 0.0]])
    assert torch.equal(second_moment_mask(log_ratio, adv, torch.ones(1, 3), 0.0), torch.ones(1, 3))


def test_m2po_loss_over_the_batch_mask_by_hand():
    fn = POLICY_LOSS_FN.get("m2po")()
    logprob = LOG_RATIO.clone().requires_grad_()
    old = torch.zeros(2, 4)
    assert fn.batch_keys == ("logprob", "old_logprob", "action_mask", "advantages")
    inputs = fn.batch_inputs(logprob=logprob.detach(), old_logprob=old, action_mask=MASK,
                             advantages=ADV)  # fmt: skip
    assert torch.equal(inputs["m2po_mask"], KEPT)
    loss, metrics = fn(logprob=logprob, old_logprob=old, action_mask=MASK, advantages=ADV,
                       m2po_mask=inputs["m2po_mask"])  # fmt: skip
    # -A r on kept tokens, over all 7 valid tokens (masked ones count in the denominator)
    kept_sum = -(math.exp(0.1) + math.exp(-0.3) + 1.0) + (math.exp(-0.2) + math.exp(0.4))
    assert loss.item() == pytest.approx(kept_sum / 7, abs=1e-6)
    assert metrics["m2po_masked_frac"] == pytest.approx(2 / 7)
    loss.backward()
    # d(-A r)/d log pi = -A r on kept tokens; masked ones get no gradient
    expected = -ADV * LOG_RATIO.exp() * KEPT / 7
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_only_m2po_asks_for_a_whole_batch_pass():
    assert POLICY_LOSS_FN.get("ppo").batch_keys == ()
    with pytest.raises(ValueError, match="m2_threshold"):
        POLICY_LOSS_FN.get("m2po")(m2_threshold=-1.0)
    config = ALGORITHM_TYPE.get("m2po").default_config()
    assert (config["policy_loss_fn"], config["kl_loss_fn"]) == ("m2po", "none")
