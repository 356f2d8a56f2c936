"""The "staleness_control" sample strategy: drop and downweight modes."""

import pytest

from tests.unit.test_sample_warmup import ListReader, make_exp, names
from trinity.algorithm import SAMPLE_STRATEGY
from trinity.algorithm.sample_strategy.staleness import StalenessControlSampleStrategy

# Train step 5 updates the weights of step 4, so staleness = 4 - model_version.
STEP = 5


def versions(*vs):
    return [make_exp(f"v{v}_{i}", version=v) for i, v in enumerate(vs)]


def test_registered_with_defaults():
    cls = SAMPLE_STRATEGY.get("staleness_control")
    assert cls is StalenessControlSampleStrategy
    assert cls.default_args() == {"max_staleness": 1, "mode": "drop", "decay": 0.5}


def test_drop_reads_on_until_the_batch_is_fresh():
    # versions 4 2 3 1 4 4 -> staleness 0 2 1 3 0 0; bound 1 keeps staleness 0 and 1
    reader = ListReader(versions(4, 2, 3, 1, 4, 4))
    strategy = StalenessControlSampleStrategy(reader, max_staleness=1, mode="drop")
    exps, metrics = strategy.sample(STEP, 3)
    # read 3: keep v4, v3, drop v2; read 1: drop v1; read 1: keep v4 -> 3 fresh
    assert names(exps) == ["v4_0", "v3_2", "v4_4"]
    assert reader.reads == [3, 1, 1]
    assert metrics["sample/stale_dropped"] == 2.0
    assert metrics["sample/stale_dropped_total"] == 2.0
    assert metrics["sample/experience_count"] == 3.0
    assert metrics["sample/staleness/mean"] == pytest.approx(1 / 3)  # (0 + 1 + 0) / 3
    assert metrics["sample/staleness/max"] == 1.0
    assert "sample_weight" not in exps[0].info
    assert strategy.state_dict() == {"total_dropped": 2}


def test_drop_stops_at_a_short_read_and_lets_the_end_through():
    reader = ListReader(versions(1, 4))
    strategy = StalenessControlSampleStrategy(reader, max_staleness=1)
    # one read of 3 returns only 2 (v1 stale, v4 fresh): a short read ends the step
    exps, metrics = strategy.sample(STEP, 3)
    assert names(exps) == ["v4_1"]
    assert metrics["sample/stale_dropped"] == 1.0
    assert reader.reads == [3]
    with pytest.raises(StopIteration):
        strategy.sample(STEP + 1, 3)


def test_drop_of_everything_before_the_end_raises_stop_iteration():
    reader = ListReader(versions(0, 0))  # one read of 2 drops both, the next one ends
    strategy = StalenessControlSampleStrategy(reader, max_staleness=1)
    with pytest.raises(StopIteration):
        strategy.sample(STEP, 2)
    assert strategy.total_dropped == 2  # still counted (and logged)


def test_downweight_keeps_everything_with_decayed_weights():
    # staleness 0 1 2 3 with bound 1 -> excess -, -, 1, 2 -> weights 1, 1, 0.5, 0.25
    reader = ListReader(versions(4, 3, 2, 1))
    strategy = StalenessControlSampleStrategy(reader, max_staleness=1, mode="downweight")
    exps, metrics = strategy.sample(STEP, 4)
    assert [e.info["sample_weight"] for e in exps] == [1.0, 1.0, 0.5, 0.25]
    assert metrics["sample/sample_weight/mean"] == pytest.approx(2.75 / 4)
    assert metrics["sample/stale_count"] == 2.0
    assert metrics["sample/staleness/mean"] == pytest.approx(1.5)  # (0 + 1 + 2 + 3) / 4
    assert "sample/stale_dropped" not in metrics


def test_downweight_with_bound_zero_and_custom_decay():
    # step 5, versions 4 and 2: staleness 0 and 2, bound 0 -> weights 1 and 0.9 ** 2
    reader = ListReader(versions(4, 2))
    strategy = StalenessControlSampleStrategy(reader, max_staleness=0, mode="downweight", decay=0.9)
    exps, _ = strategy.sample(STEP, 2)
    assert [e.info["sample_weight"] for e in exps] == pytest.approx([1.0, 0.81])


def test_invalid_arguments():
    with pytest.raises(ValueError, match="mode"):
        StalenessControlSampleStrategy(ListReader([]), mode="skip")
    with pytest.raises(ValueError, match="decay"):
        StalenessControlSampleStrategy(ListReader([]), mode="downweight", decay=1.5)
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessControlSampleStrategy(ListReader([]), max_staleness=-1)


def test_state_restores_the_drop_total():
    strategy = StalenessControlSampleStrategy(ListReader([]))
    strategy.load_state_dict({"total_dropped": 7})
    assert strategy.state_dict() == {"total_dropped": 7}
