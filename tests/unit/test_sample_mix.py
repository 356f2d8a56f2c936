"""The "mix" sample strategy: RL experiences plus a share of expert data per batch."""

import pytest

from tests.unit.test_sample_warmup import ListReader, names, rl_data, sft_data
from trinity.algorithm import SAMPLE_STRATEGY
from trinity.algorithm.sample_strategy.mix import MixSampleStrategy, expert_count


def test_registered_with_defaults():
    assert SAMPLE_STRATEGY.get("mix") is MixSampleStrategy
    assert MixSampleStrategy.default_args() == {
        "expert_buffer": "sft_dataset",
        "expert_data_ratio": 0.5,
    }


@pytest.mark.parametrize(
    "batch_size, ratio, expected",
    [(4, 0.5, 2), (5, 0.5, 3), (3, 0.5, 2), (4, 0.25, 1), (10, 0.33, 3), (4, 0.0, 0), (4, 1, 4)],
)
def test_expert_count_rounds_halves_up(batch_size, ratio, expected):
    # 5 * 0.5 = 2.5 -> 3 and 3 * 0.5 = 1.5 -> 2 (Python's round gives 2 and 2); 3.3 -> 3
    assert expert_count(batch_size, ratio) == expected


def test_batch_is_rl_then_expert_rows():
    main, sft = ListReader(rl_data(4, version=2)), ListReader(sft_data(4))
    strategy = MixSampleStrategy(main, {"sft_dataset": sft}, expert_data_ratio=0.25)
    # batch 4, ratio 0.25 -> 1 expert row, 3 RL rows
    exps, metrics = strategy.sample(1, 4)
    assert names(exps) == ["r0", "r1", "r2", "s0"]
    assert [e.info["is_expert"] for e in exps] == [False, False, False, True]
    assert main.reads == [3] and sft.reads == [1]
    assert metrics["sample/experience_count"] == 4.0
    assert metrics["sample/expert_count"] == 1.0
    assert metrics["sample/model_version/mean"] == 2.0  # over the RL rows only
    assert metrics["sample/model_version/min"] == 2.0
    assert metrics["sample/expert_exhausted"] == 0.0


def test_ratio_zero_reads_only_rl_and_needs_no_expert_buffer():
    strategy = MixSampleStrategy(ListReader(rl_data(2)), None, expert_data_ratio=0.0)
    exps, metrics = strategy.sample(1, 2)
    assert names(exps) == ["r0", "r1"]
    assert metrics["sample/expert_count"] == 0.0


def test_ratio_one_reads_only_expert_rows():
    main, sft = ListReader(rl_data(2)), ListReader(sft_data(2))
    strategy = MixSampleStrategy(main, {"sft_dataset": sft}, expert_data_ratio=1.0)
    assert names(strategy.sample(1, 2)[0]) == ["s0", "s1"]
    assert main.reads == []


def test_missing_expert_buffer_names_the_config_key():
    with pytest.raises(ValueError, match=r"buffer\.trainer_input\.auxiliary_buffers\.sft_dataset"):
        MixSampleStrategy(ListReader([]), {})
    with pytest.raises(ValueError, match="expert_data_ratio"):
        MixSampleStrategy(ListReader([]), {"sft_dataset": ListReader([])}, expert_data_ratio=1.5)


def test_rl_flag_already_set_is_kept():
    rl = rl_data(1)
    rl[0].info["is_expert"] = True  # e.g. an explorer workflow that replays demonstrations
    strategy = MixSampleStrategy(ListReader(rl), {"e": ListReader([])}, "e", 0.0)
    assert strategy.sample(1, 1)[0][0].info["is_expert"] is True


def test_expert_data_running_out_keeps_the_rl_rows():
    main, sft = ListReader(rl_data(8)), ListReader(sft_data(1))
    strategy = MixSampleStrategy(main, {"sft_dataset": sft})
    # step 1: 2 RL + the last expert row (a short read)
    assert names(strategy.sample(1, 4)[0]) == ["r0", "r1", "s0"]
    # step 2: 2 RL rows read, then the expert reader ends: the RL rows are still returned
    exps, metrics = strategy.sample(2, 4)
    assert names(exps) == ["r2", "r3"]
    assert metrics["sample/expert_exhausted"] == 1.0
    assert metrics["sample/expert_count"] == 0.0
    # step 3: RL only, full batch
    assert names(strategy.sample(3, 4)[0]) == ["r4", "r5", "r6", "r7"]
    assert main.reads == [2, 2, 4] and sft.reads == [2, 2]


def test_main_buffer_end_consumes_no_expert_row():
    main, sft = ListReader([]), ListReader(sft_data(2))
    strategy = MixSampleStrategy(main, {"sft_dataset": sft})
    with pytest.raises(StopIteration):
        strategy.sample(1, 4)
    assert sft.reads == []


def test_state_restores_the_expert_position():
    strategy = MixSampleStrategy(ListReader(rl_data(2)), {"sft_dataset": ListReader(sft_data(4))})
    strategy.sample(1, 2)
    state = strategy.state_dict()
    assert state == {"expert_exhausted": False, "auxiliary": {"sft_dataset": {"pos": 1}}}
    resumed = MixSampleStrategy(ListReader(rl_data(2)), {"sft_dataset": ListReader(sft_data(4))})
    resumed.load_state_dict(state)
    assert names(resumed.sample(2, 2)[0]) == ["r0", "s1"]
    with pytest.raises(ValueError, match="auxiliary reader 'sft_dataset'"):
        MixSampleStrategy(ListReader([]), None, expert_data_ratio=0.0).load_state_dict(state)
