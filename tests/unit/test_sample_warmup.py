"""The "warmup" sample strategy (and the list reader the other sample-strategy tests share)."""

from typing import List, Optional

import pytest

from trinity.algorithm import SAMPLE_STRATEGY
from trinity.algorithm.sample_strategy.warmup import WarmupSampleStrategy
from trinity.common.experience import Experience


def make_exp(
    name: str, reward: float = 0.0, version: int = 0, group: str = "", resp_len: int = 1
) -> Experience:
    """A 2-token prompt and ``resp_len`` response tokens; ``name`` goes in ``info``."""
    return Experience(
        tokens=[1, 2] + [3] * resp_len,
        prompt_length=2,
        reward=reward,
        group_id=group,
        model_version=version,
        info={"name": name},
    )


def names(exps: List[Experience]) -> List[str]:
    return [e.info["name"] for e in exps]


class ListReader:
    """Hands out a fixed list in order: at most ``chunk`` per read (a queue read that timed
    out), ``StopIteration`` once empty; ``reads`` records each requested size."""

    def __init__(self, exps: List[Experience], chunk: Optional[int] = None) -> None:
        self.exps, self.chunk, self.pos, self.reads = list(exps), chunk, 0, []

    def read(self, n: int, timeout: Optional[float] = None) -> List[Experience]:
        self.reads.append(n)
        if self.pos >= len(self.exps):
            raise StopIteration("empty")
        k = min(n, self.chunk or n)
        out = self.exps[self.pos : self.pos + k]
        self.pos += len(out)
        return out

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def sft_data(n: int) -> List[Experience]:
    return [make_exp(f"s{i}") for i in range(n)]


def rl_data(n: int, version: int = 3) -> List[Experience]:
    return [make_exp(f"r{i}", version=version) for i in range(n)]


def test_registered_with_defaults():
    assert SAMPLE_STRATEGY.get("warmup") is WarmupSampleStrategy
    assert WarmupSampleStrategy.default_args() == {"warmup_steps": 0, "warmup_buffer": "sft_warmup"}


def test_first_steps_read_the_warmup_buffer_then_the_main_one():
    main, sft = ListReader(rl_data(4)), ListReader(sft_data(6))
    strategy = WarmupSampleStrategy(main, {"sft_warmup": sft}, warmup_steps=2)
    # steps 1 and 2 (1-based, as the trainer counts) are warmup: s0 s1, then s2 s3
    exps, metrics = strategy.sample(1, 2)
    assert names(exps) == ["s0", "s1"]
    assert all(e.info["is_expert"] is True for e in exps)
    assert metrics["sample/warmup"] == 1.0
    assert metrics["sample/expert_count"] == 2.0
    assert metrics["sample/experience_count"] == 2.0
    assert "sample/model_version/mean" not in metrics  # expert data has no policy version
    assert names(strategy.sample(2, 2)[0]) == ["s2", "s3"]
    # step 3 is past warmup: main buffer, not marked expert; versions 3 -> mean 3
    exps, metrics = strategy.sample(3, 2)
    assert names(exps) == ["r0", "r1"]
    assert all("is_expert" not in e.info for e in exps)
    assert metrics["sample/warmup"] == 0.0
    assert metrics["sample/expert_count"] == 0.0
    assert metrics["sample/model_version/mean"] == 3.0
    assert sft.reads == [2, 2] and main.reads == [2]


def test_missing_warmup_buffer_names_the_config_key():
    with pytest.raises(ValueError, match=r"buffer\.trainer_input\.auxiliary_buffers\.sft_warmup"):
        WarmupSampleStrategy(ListReader([]), None, warmup_steps=1)
    with pytest.raises(ValueError, match=r"auxiliary_buffers\.expert \(configured: other\)"):
        WarmupSampleStrategy(
            ListReader([]), {"other": ListReader([])}, warmup_steps=1, warmup_buffer="expert"
        )


def test_no_warmup_needs_no_auxiliary_buffer():
    strategy = WarmupSampleStrategy(ListReader(rl_data(2)), None, warmup_steps=0)
    assert names(strategy.sample(1, 2)[0]) == ["r0", "r1"]


def test_custom_buffer_name():
    sft = ListReader(sft_data(1))
    strategy = WarmupSampleStrategy(ListReader([]), {"mine": sft}, 1, warmup_buffer="mine")
    assert names(strategy.sample(1, 1)[0]) == ["s0"]


def test_warmup_data_running_out_moves_on_to_the_main_buffer():
    main, sft = ListReader(rl_data(4)), ListReader(sft_data(2))
    strategy = WarmupSampleStrategy(main, {"sft_warmup": sft}, warmup_steps=3)
    assert names(strategy.sample(1, 2)[0]) == ["s0", "s1"]
    # step 2 is still a warmup step, but the warmup reader raises StopIteration
    exps, metrics = strategy.sample(2, 2)
    assert names(exps) == ["r0", "r1"]
    assert metrics["sample/warmup"] == 0.0
    assert metrics["sample/warmup_exhausted"] == 1.0
    # step 3: the exhausted reader is not asked again
    assert names(strategy.sample(3, 2)[0]) == ["r2", "r3"]
    assert sft.reads == [2, 2]


def test_state_restores_the_warmup_position():
    strategy = WarmupSampleStrategy(
        ListReader([]), {"sft_warmup": ListReader(sft_data(4))}, warmup_steps=2
    )
    strategy.sample(1, 2)
    state = strategy.state_dict()
    assert state == {"warmup_exhausted": False, "auxiliary": {"sft_warmup": {"pos": 2}}}
    resumed = WarmupSampleStrategy(
        ListReader([]), {"sft_warmup": ListReader(sft_data(4))}, warmup_steps=2
    )
    resumed.load_state_dict(state)
    assert names(resumed.sample(2, 2)[0]) == ["s2", "s3"]
