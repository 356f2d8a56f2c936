import pytest

from trinity.common.sync_schedule import required_version


@pytest.mark.parametrize(
    "interval,offset,expected",
    [
        (1, 0, [0, 1, 2, 3, 4]),  # on-policy: step s uses the weights after s-1 updates
        (1, 1, [0, 0, 1, 2, 3]),  # one step ahead of the trainer
        (2, 0, [0, 0, 2, 2, 4]),  # refresh every second step
    ],
)
def test_required_version(interval, offset, expected):
    assert [required_version(s, interval, offset) for s in range(1, 6)] == expected


def test_pack_state_round_trips_float32_and_bf16():
    import torch

    from trinity.common.weights import pack_state, unpack_state

    state = {"w": torch.randn(3, 2), "b": torch.randn(4).to(torch.bfloat16)}
    back = unpack_state(pack_state(state))
    assert back["w"].dtype == torch.float32 and torch.equal(back["w"], state["w"])
    assert back["b"].dtype == torch.bfloat16 and torch.equal(back["b"], state["b"])
