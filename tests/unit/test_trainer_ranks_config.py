"""``trainer.cpu_ranks``: what a config with several CPU trainer ranks may and may not ask."""

import logging
import textwrap

import pytest

import trinity.common.config.gpus as gpus_module
from trinity.common.config import ConfigError, load_config
from trinity.preflight.derive import finalize
from trinity.preflight.ranks import warn_ranks

BASE = """
project: proj
name: exp
checkpoint_root_dir: /ck
model:
  model_path: /models/tiny
  max_prompt_tokens: 100
  max_response_tokens: 28
algorithm:
  algorithm_type: grpo
  repeat_times: 2
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: train, path: /data}
"""


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 0)


def finalized(tmp_path, overrides):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(BASE))
    return finalize(load_config(str(path), list(overrides)))


def problems(tmp_path, overrides):
    with pytest.raises(ConfigError) as excinfo:
        finalized(tmp_path, overrides)
    return excinfo.value.problems


def test_one_rank_is_the_default_and_two_are_accepted(tmp_path):
    assert finalized(tmp_path, []).trainer.cpu_ranks == 1
    assert finalized(tmp_path, ["trainer.cpu_ranks=2"]).trainer.cpu_ranks == 2


def test_cpu_ranks_with_gpus_is_an_error(tmp_path):
    found = problems(tmp_path, ["trainer.cpu_ranks=2", "cluster.gpu_per_node=8"])
    # the other problem: this machine has no 8 GPUs (gpus.py)
    (ranks,) = [p for p in found if p.startswith("trainer.cpu_ranks = 2 with cluster.gpu_")]
    assert "set trainer.cpu_ranks: 1 or cluster.gpu_per_node: 0" in ranks


def test_rank_count_must_divide_the_batch(tmp_path):
    found = problems(tmp_path, ["trainer.cpu_ranks=3"])  # train_batch_size 4 * 2 = 8
    assert found == [
        "buffer.train_batch_size = 8 is not a multiple of 3 (trainer.cpu_ranks = 3): each "
        "rank trains an equal share of a step's experiences"
    ]


def test_zero_ranks_and_unsupported_combinations(tmp_path):
    assert problems(tmp_path, ["trainer.cpu_ranks=0"]) == ["trainer.cpu_ranks = 0 must be >= 1"]
    found = problems(tmp_path, ["trainer.cpu_ranks=2", "algorithm.algorithm_type=ppo"])
    assert any("trains a critic" in p and "trainer.cpu_ranks = 2" in p for p in found), found


def test_explore_mode_ignores_ranks(tmp_path):
    config = finalized(tmp_path, ["trainer.cpu_ranks=3", "mode=explore"])
    assert config.trainer.cpu_ranks == 3


def test_more_ranks_than_cores_warns(tmp_path, monkeypatch, caplog):
    config = finalized(tmp_path, ["trainer.cpu_ranks=4"])
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        warn_ranks(config)
    assert "trainer.cpu_ranks = 4 exceeds this machine's 2 CPU cores" in caplog.text
