"""DAPO: the overlong penalty, and the "dapo" sample strategy's dynamic sampling."""

import json

import pytest
import torch

from tests.unit.test_sample_warmup import ListReader, make_exp, names
from trinity.algorithm import SAMPLE_STRATEGY
from trinity.algorithm.reward_shaping import overlong_penalty
from trinity.algorithm.sample_strategy.dapo import DAPOSampleStrategy, split_groups


def test_overlong_penalty_worked_example():
    # max_len 10, buffer 4 -> penalties start after 10 - 4 = 6 tokens, -1/4 per extra token
    lengths = torch.tensor([5, 6, 7, 10, 12])
    expected = torch.tensor([0.0, 0.0, -0.25, -1.0, -1.5])
    assert torch.allclose(overlong_penalty(lengths, 10, 4, 1.0), expected)
    assert torch.allclose(overlong_penalty(lengths, 10, 4, 0.5), expected / 2)
    assert overlong_penalty(lengths, 10, 4).shape == (5,)


def test_overlong_penalty_rejects_bad_buffers():
    with pytest.raises(ValueError, match="positive"):
        overlong_penalty(torch.tensor([1]), 10, 0, 1.0)
    with pytest.raises(ValueError, match="exceeds"):
        overlong_penalty(torch.tensor([1]), 10, 11, 1.0)


def group(gid, *rewards, resp_len=1):
    return [make_exp(f"{gid}{i}", r, group=gid, resp_len=resp_len) for i, r in enumerate(rewards)]


def test_registered_with_defaults():
    assert SAMPLE_STRATEGY.get("dapo") is DAPOSampleStrategy
    assert DAPOSampleStrategy.default_args() == {
        "max_read_batches": 10,
        "overlong_buffer_len": 0,
        "overlong_penalty_factor": 1.0,
        "refill_timeout": 5.0,
    }


class OpenQueue:
    """A queue that stays open: after its data, reads time out empty (never StopIteration)."""

    def __init__(self, exps):
        self.exps = list(exps)

    def read(self, n, timeout=None):
        out, self.exps = self.exps[:n], self.exps[n:]
        return out


def test_refill_that_times_out_trains_on_what_was_kept():
    # a: rewards 1,0 (informative, kept); b: 0,0 (dropped); nothing more arrives in time
    strategy = DAPOSampleStrategy(OpenQueue(group("a", 1, 0) + group("b", 0, 0)), group_size=2)
    exps, metrics = strategy.sample(1, 4)
    assert names(exps) == ["a0", "a1"]
    assert metrics["sample/groups_dropped"] == 1


def test_only_uninformative_groups_fall_back_to_training_on_them():
    strategy = DAPOSampleStrategy(OpenQueue(group("b", 0, 0) + group("c", 1, 1)), group_size=2)
    exps, metrics = strategy.sample(1, 4)
    assert names(exps) == ["b0", "b1", "c0", "c1"]  # zero advantages, but the step completes
    assert metrics["sample/fallback_groups"] == 2


def test_split_groups_keeps_an_unfinished_last_run():
    exps = group("a", 1, 1, 1) + group("b", 0)
    groups, rest = split_groups(exps, group_size=2, final=False)
    assert [names(g) for g in groups] == [["a0", "a1", "a2"]]
    assert names(rest) == ["b0"]
    groups, rest = split_groups(exps, group_size=2, final=True)
    assert [names(g) for g in groups] == [["a0", "a1", "a2"], ["b0"]] and rest == []


# a: all 1 (dropped), b: 0 1 (kept), c: all 0 (dropped), d: 1 0 (kept), e: spare
STREAM = (
    group("a", 1, 1) + group("b", 0, 1) + group("c", 0, 0) + group("d", 1, 0) + group("e", 1, 0)
)


def test_dynamic_sampling_reads_on_past_zero_variance_groups():
    reader = ListReader(STREAM, chunk=3)  # reads of at most 3 cut groups in two
    strategy = DAPOSampleStrategy(reader, group_size=2)
    exps, metrics = strategy.sample(1, 4)
    # read 4 (gets a0 a1 b0): a dropped, b0 waits; read 4 - 1 = 3 (b1 c0 c1): b kept,
    # c dropped; read 2 (d0 d1): d kept -> 4 experiences
    assert names(exps) == ["b0", "b1", "d0", "d1"]
    assert reader.reads == [4, 3, 2]
    assert metrics["sample/groups_dropped"] == 2.0
    assert metrics["sample/groups_kept"] == 2.0
    assert metrics["sample/read_batches"] == 3.0
    assert metrics["sample/max_read_batches_reached"] == 0.0
    assert metrics["sample/pending"] == 0.0
    assert metrics["sample/overlong_penalty_mean"] == 0.0
    assert [e.reward for e in exps] == [0.0, 1.0, 1.0, 0.0]  # shaping is off


def test_max_read_batches_returns_what_it_has():
    reader = ListReader(STREAM, chunk=3)
    strategy = DAPOSampleStrategy(reader, group_size=2, max_read_batches=2)
    exps, metrics = strategy.sample(1, 4)
    assert names(exps) == ["b0", "b1"]  # the same first two reads as above
    assert metrics["sample/max_read_batches_reached"] == 1.0
    assert metrics["sample/read_batches"] == 2.0


def test_reader_end_flushes_an_incomplete_group_then_stops():
    # group_size 3: a is complete; b has only 2 members when the reader ends
    reader = ListReader(group("a", 0, 1, 1) + group("b", 1, 0))
    strategy = DAPOSampleStrategy(reader, group_size=3)
    exps, metrics = strategy.sample(1, 6)
    # read 6 (gets 5): a kept, b waits; read max(3, 3) - 2 = 1: ends -> b flushed, kept
    assert names(exps) == ["a0", "a1", "a2", "b0", "b1"]
    assert reader.reads == [6, 1]
    assert metrics["sample/max_read_batches_reached"] == 0.0
    with pytest.raises(StopIteration):
        strategy.sample(2, 6)


def test_group_that_does_not_fit_waits_for_the_next_step_across_a_checkpoint():
    # a has 3 members (e.g. a multi-turn task): 3 + 2 > 4, so b is held back
    reader = ListReader(group("a", 0, 1, 1) + group("b", 1, 0))
    strategy = DAPOSampleStrategy(reader, group_size=2)
    exps, metrics = strategy.sample(1, 4)
    # read 4 (a0 a1 a2 b0): a kept, b0 waits; read max(1, 2) - 1 = 1 (b1): b does not fit
    assert names(exps) == ["a0", "a1", "a2"] and reader.reads == [4, 1]
    assert metrics["sample/pending"] == 2.0
    state = json.loads(json.dumps(strategy.state_dict()))  # extra.json round trip
    resumed = DAPOSampleStrategy(ListReader([]), group_size=2)
    resumed.load_state_dict(state)
    exps, _ = resumed.sample(2, 4)  # b, then the (empty) reader ends
    assert names(exps) == ["b0", "b1"] and [e.reward for e in exps] == [1.0, 0.0]


def test_overlong_shaping_applies_after_filtering():
    # max 10 tokens, buffer 4: lengths 7 -> -0.25, 10 -> -1. Group a has equal raw rewards,
    # so it is dropped although its shaped rewards (1 - 0 and 1 - 1) would differ.
    stream = group("a", 1, 1, resp_len=10)
    stream[0] = make_exp("a0", 1, group="a", resp_len=5)
    stream += [make_exp("b0", 1, group="b", resp_len=7), make_exp("b1", 0, group="b", resp_len=10)]
    strategy = DAPOSampleStrategy(
        ListReader(stream), group_size=2, overlong_buffer_len=4, max_response_tokens=10
    )
    exps, metrics = strategy.sample(1, 2)
    assert names(exps) == ["b0", "b1"]
    assert [e.reward for e in exps] == pytest.approx([0.75, -1.0])
    assert [e.info["overlong_penalty"] for e in exps] == pytest.approx([-0.25, -1.0])
    assert metrics["sample/overlong_penalty_mean"] == pytest.approx(-0.625)
    assert metrics["sample/groups_dropped"] == 1.0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="group_size"):
        DAPOSampleStrategy(ListReader([]))
    with pytest.raises(ValueError, match="max_response_tokens"):
        DAPOSampleStrategy(ListReader([]), group_size=2, overlong_buffer_len=4)
    with pytest.raises(ValueError, match="multiple of group_size"):
        DAPOSampleStrategy(ListReader([]), group_size=2).sample(1, 3)
    with pytest.raises(ValueError, match="group_id"):
        DAPOSampleStrategy(ListReader([make_exp("x")]), group_size=2).sample(1, 2)
