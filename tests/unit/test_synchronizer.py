import pytest

from trinity.runtime.synchronizer import required_version


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
