"""What the engine does when rows end or must not end yet, checked by hand: finished rows
leave the KV cache by the last running rows moving into their places (``fill_from_tail``,
``GrowingLayer.batch_select_indices``), and min_tokens' stop ids leave the distribution
by their weights being zeroed (``sampling.drop_tokens``)."""

import pytest
import torch

from trinity.engine.sampling import drop_tokens
from trinity.engine.streaming import fill_from_tail
from trinity.ops.kv_cache import GrowingLayer


def test_fill_from_tail_moves_the_last_running_rows_into_the_finished_ones():
    def keep(done):
        return fill_from_tail(torch.tensor(done, dtype=torch.bool)).tolist()

    assert keep([0, 1, 0, 0, 1, 0]) == [0, 5, 2, 3]  # row 1's place goes to row 5
    assert keep([1, 1, 0, 0, 0]) == [3, 4, 2]  # rows 3 and 4 fill places 0 and 1, in order
    assert keep([0, 0, 1]) == [0, 1]  # the last row ends: nothing moves
    assert keep([0, 0, 0]) == [0, 1, 2]
    assert keep([1, 1]) == []


def layer_with_rows(rows: int, length: int = 3) -> GrowingLayer:
    """A cache layer whose row ``b`` holds keys ``b`` and values ``-b`` in every column."""
    layer = GrowingLayer(capacity=8)
    keys = torch.arange(rows, dtype=torch.float32)[:, None, None, None].expand(rows, 2, length, 4)
    layer.update(keys.clone(), -keys.clone())
    return layer


@pytest.mark.parametrize(
    "indices",
    [[0, 5, 2, 3], [5, 4, 3, 2, 1, 0], [1, 1, 2], [0, 1, 2, 3, 4, 5], [2, 0, 1, 0, 5, 5, 3, 4]],
)
def test_selecting_rows_in_place_keeps_each_rows_keys(indices):
    layer = layer_with_rows(6)
    before = layer.buffers()[0].data_ptr()
    layer.batch_select_indices(torch.tensor(indices))
    expected = torch.tensor(indices, dtype=torch.float32)[:, None, None, None].expand(-1, 2, 3, 4)
    assert torch.equal(layer.keys, expected) and torch.equal(layer.values, -expected)
    assert layer.buffers()[0].shape == (len(indices), 2, 8, 4)  # the unwritten columns stay
    assert (layer.buffers()[0][:, :, 3:] == 0).all()
    # as many rows or fewer: the same buffer, nothing allocated; more (a prefill's
    # expansion to its rows): a new one
    assert (layer.buffers()[0].data_ptr() == before) == (len(indices) <= 6)
    layer.update(torch.full((len(indices), 2, 1, 4), 9.0), torch.full((len(indices), 2, 1, 4), 9.0))
    assert (layer.keys[:, :, 3] == 9).all() and layer.keys.shape[2] == 4


def test_dropping_stop_ids_is_masking_and_exponentiating_again():
    # row 0 keeps its max (2): weights exp(s - 2), token 1's zeroed; row 1's max (5) is
    # dropped and its other scores sit 205 and 305 below it, where exp underflows to 0: the
    # row is exponentiated again from its remaining max (-200)
    scores = torch.tensor([[0.0, 1.0, 2.0], [5.0, -200.0, -300.0]])
    weights = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    assert weights[1, 1] == 0
    dropped = drop_tokens(weights, scores, torch.tensor([0, 1]), torch.tensor([1, 0]))
    expected = torch.tensor([[torch.tensor(-2.0).exp(), 0.0, 1.0], [0.0, 1.0, 0.0]])
    expected[1, 2] = torch.tensor(-100.0).exp()  # 3.7e-44, a float32 subnormal
    assert torch.equal(dropped, expected)


def test_dropping_stop_ids_gives_the_masked_weights_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(16, 500, generator=gen) * 4
    rows = torch.tensor([0, 0, 3, 5, 5, 9, 15])
    ids = torch.tensor([7, 8, 1, 2, 3, 499, 0])
    ids[2] = scores[3].argmax()  # some of them the row's most likely token
    ids[5] = scores[9].argmax()
    masked = scores.clone()
    masked[rows, ids] = float("-inf")
    expected = (masked - masked.amax(dim=-1, keepdim=True)).exp()
    weights = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    assert torch.equal(drop_tokens(weights, scores, rows, ids), expected)
