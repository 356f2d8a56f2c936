"""``synchronizer`` in a staged config: the global section applies where a stage both explores
and trains, a stage that only trains or only explores says in one line what it ignores, and a
stage may set its own ``synchronizer``."""

import logging
import os

import pytest

from trinity.common.config import ConfigError, load_config
from trinity.preflight.derive import derive

STAGED = """
mode: both
model: {model_path: /model}
algorithm: {algorithm_type: grpo, repeat_times: 4}
buffer:
  batch_size: 4
  total_steps: 10
  explorer_input:
    taskset: {name: rl, path: /data/rl}
  trainer_input:
    experience_buffer: {name: exp, storage_type: queue}
synchronizer: {sync_style: fixed, sync_interval: 1}
stages:
  - stage_name: sft
    mode: train
    algorithm: {algorithm_type: sft}
    buffer:
      trainer_input:
        experience_buffer: {name: sft, storage_type: file, path: /data/sft}
  - stage_name: rl
"""


def load(tmp_path, *overrides):
    path = os.path.join(tmp_path, "staged.yaml")
    with open(path, "w") as f:
        f.write(STAGED)
    return load_config(path, list(overrides))


def sync_problems_of(stage):
    _, problems = derive(stage)
    return [p for p in problems if "synchronizer" in p]


def test_a_global_sync_style_applies_to_the_stage_that_explores_and_trains(tmp_path):
    root = load(tmp_path, "synchronizer.sync_style=fully_async", "synchronizer.sync_interval=2")
    sft, rl = root.stage_configs()
    assert rl.synchronizer.sync_style == "fully_async" and rl.synchronizer.sync_interval == 2
    # the train-only stage runs with the defaults, so fully_async is no error there
    assert sft.synchronizer.sync_style == "fixed" and sft.synchronizer.sync_interval == 1
    assert sync_problems_of(sft) == [] and sync_problems_of(rl) == []
    assert root.ignored_synchronizer() == [
        "stage 'sft' (mode train) ignores synchronizer.sync_interval=2, "
        "synchronizer.sync_style=fully_async: weights sync only in a stage that both explores and "
        "trains (stages.0.synchronizer sets this stage's own)"
    ]


def test_default_global_values_are_not_reported_as_ignored(tmp_path):
    # the file sets sync_style: fixed and sync_interval: 1, both the defaults
    assert load(tmp_path).ignored_synchronizer() == []


def test_a_stage_sets_its_own_synchronizer(tmp_path):
    root = load(tmp_path, "stages.1.synchronizer.sync_style=trainer_driven")
    sft, rl = root.stage_configs()
    assert (sft.synchronizer.sync_style, rl.synchronizer.sync_style) == ("fixed", "trainer_driven")
    assert root.synchronizer.sync_style == "fixed"  # the global section is unchanged


def test_a_train_stage_own_dynamic_style_is_ignored_with_a_line(tmp_path, caplog):
    root = load(tmp_path, "stages.0.synchronizer.sync_style=fully_async")
    sft, _ = root.stage_configs()
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        sft, _ = derive(sft)
    assert sft.synchronizer.sync_style == "fixed" and sync_problems_of(sft) == []
    assert "synchronizer.sync_style = fully_async: ignored in mode train" in caplog.text


def test_a_stage_synchronizer_key_is_checked_like_the_global_one(tmp_path):
    with pytest.raises(ConfigError, match=r"stages\[1\]\.synchronizer\.sync_intervall: unknown"):
        load(tmp_path, "stages.1.synchronizer.sync_intervall=2")
