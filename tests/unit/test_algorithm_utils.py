"""masked_mean / masked_sum / aggregate_loss against hand-computed values."""

import pytest
import torch

from trinity.algorithm.utils import LOSS_AGG_MODES, aggregate_loss, masked_mean, masked_sum

# loss = [[1, 2, 3],     mask = [[1, 1, 0],
#         [4, 5, 6]]             [1, 0, 0]]
# valid tokens: row 0 -> 1, 2 (sum 3, mean 1.5); row 1 -> 4 (sum 4, mean 4)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_masked_sum_and_mean():
    assert masked_sum(LOSS, MASK).item() == pytest.approx(7.0)
    assert masked_mean(LOSS, MASK).item() == pytest.approx(7.0 / 3.0)
    assert torch.allclose(masked_mean(LOSS, MASK, dim=-1), torch.tensor([1.5, 4.0]))
    # A bool mask works like a float one.
    assert masked_mean(LOSS, MASK.bool()).item() == pytest.approx(7.0 / 3.0)


def test_masked_mean_of_nothing_is_zero_not_nan():
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 rows
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 rows
        ("seq-mean-token-sum-norm", 7.0 / 6.0),  # (3/3 + 4/3) / 2 rows, norm = R = 3
    ],
)
def test_aggregate_loss_modes(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_with_constant_divisor():
    # (3/10 + 4/10) / 2 rows = 0.35
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm=10).item() == pytest.approx(
        0.35
    )


def test_fully_masked_row_counts_as_zero_row():
    loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(1.5)
    # Row means 1.5 and 0 (no NaN), averaged over both rows as veRL does.
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(0.75)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(1.5)


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError) as err:
        aggregate_loss(LOSS, MASK, "token-sum")
    for mode in LOSS_AGG_MODES:
        assert mode in str(err.value)
