"""Clipped value loss against a hand-computed 2x3 example."""

import pytest
import torch

from trinity.algorithm.value_loss import clipped_value_loss

# cliprange_value c = 0.5; per token e_u = (v - R)^2, e_c = (old + clip(v - old, -c, c) - R)^2.
# Row 0: old 0, v [1.0, 0.2, -1.0], R [2, 0, 0]:
#   t0: e_u 1,    v_clip 0.5  -> e_c 2.25 -> 2.25 (clipped term larger)
#   t1: e_u 0.04, v_clip 0.2  -> e_c 0.04 -> 0.04 (equal: not counted as clipped)
#   t2: e_u 1,    v_clip -0.5 -> e_c 0.25 -> 1
# Row 1: old 1, v [3, 1, 9], R [1, 2, 0], last token padding:
#   t0: e_u 4, v_clip 1.5 -> e_c 0.25 -> 4;   t1: e_u 1, v_clip 1 -> e_c 1 -> 1
VALUES = torch.tensor([[1.0, 0.2, -1.0], [3.0, 1.0, 9.0]])
OLD = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
RETURNS = torch.tensor([[2.0, 0.0, 0.0], [1.0, 2.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
EXPECTED = {
    "token-mean": 0.5 * (2.25 + 0.04 + 1 + 4 + 1) / 5,  # 0.829
    "seq-mean-token-mean": 0.5 * (3.29 / 3 + 5 / 2) / 2,
    "seq-mean-token-sum": 0.5 * (3.29 + 5) / 2,
}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_clipped_value_loss(mode):
    loss, metrics = clipped_value_loss(VALUES, OLD, RETURNS, MASK, 0.5, mode)
    assert loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["vf_loss"] == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 5)  # row 0 token 0
    assert metrics["vpred_mean"] == pytest.approx((1 + 0.2 - 1 + 3 + 1) / 5)


def test_clipped_value_loss_gradient():
    values = VALUES.clone().requires_grad_()
    loss, _ = clipped_value_loss(values, OLD, RETURNS, MASK)
    loss.backward()
    # Row 0 t0 takes the clipped term, constant in v (v - old > c): 0. Otherwise
    # d 0.5 * (v - R)^2 / 5 = (v - R) / 5; padding 0.
    expected = torch.tensor([[0.0, 0.2, -1.0], [2.0, -1.0, 0.0]]) / 5
    assert torch.allclose(values.grad, expected, atol=1e-6)


def test_clipped_value_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        clipped_value_loss(VALUES, OLD, RETURNS, MASK, loss_agg_mode="sum")
