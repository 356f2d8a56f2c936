"""The "mix" entropy term counts only the non-expert (RL) rows."""

import pytest
import torch

import trinity.algorithm.entropy_loss_fn.mix  # noqa: F401  (registers "mix")
from trinity.algorithm import ENTROPY_LOSS_FN

# Rows [RL, expert, RL]. RL valid tokens: row 0 -> [1, 2], row 2 -> [7].
#   token-mean = (1 + 2 + 7) / 3 = 10/3; seq-mean-token-mean = (1.5 + 7) / 2 = 4.25.
# The expert row (4, 5, 6) must not count.
ENTROPY = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
EXPERT = torch.tensor([0.0, 1.0, 0.0])


def entropy_fn(**kwargs):
    return ENTROPY_LOSS_FN.get("mix")(**kwargs)


@pytest.mark.parametrize("mode, agg", [("token-mean", 10 / 3), ("seq-mean-token-mean", 4.25)])
def test_mix_entropy_over_rl_rows(mode, agg):
    loss, metrics = entropy_fn(entropy_coef=0.1)(ENTROPY, MASK, mode, expert_mask=EXPERT)
    assert loss.item() == pytest.approx(-0.1 * agg, abs=1e-6)
    assert metrics["entropy_loss"] == pytest.approx(-0.1 * agg, abs=1e-6)
    assert metrics["entropy"] == pytest.approx(10 / 3, abs=1e-6)  # always a token mean


def test_mix_entropy_gradient_skips_expert_rows():
    entropy = ENTROPY.clone().requires_grad_()
    loss, _ = entropy_fn(entropy_coef=0.1)(entropy, MASK, expert_mask=EXPERT)
    loss.backward()
    # token-mean over 3 RL tokens: -0.1 / 3 each; expert row and padding 0.
    g = -0.1 / 3
    expected = torch.tensor([[g, g, 0.0], [0.0, 0.0, 0.0], [g, 0.0, 0.0]])
    assert torch.allclose(entropy.grad, expected, atol=1e-6)


def test_mix_entropy_without_rl_rows_or_mask():
    fn = entropy_fn(entropy_coef=0.1)
    loss, metrics = fn(ENTROPY[[1]], MASK[[1]], expert_mask=EXPERT[[1]])
    assert loss.item() == 0.0 and metrics == {}
    with pytest.raises(ValueError, match="expert_mask"):
        fn(ENTROPY, MASK)
    with pytest.raises(ValueError, match="shape"):
        fn(ENTROPY, MASK, expert_mask=EXPERT[:2])
    assert ENTROPY_LOSS_FN.get("mix").default_args() == {"entropy_coef": 0.0}
