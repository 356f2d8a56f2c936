"""Command-line overrides reach every stage; what they replace or skip is said in one line."""

import logging
import os

import pytest

from trinity.common.config import ConfigError, load_config

STAGED = """
mode: both
algorithm: {algorithm_type: grpo, repeat_times: 4, optimizer: {lr: 1.0e-5}}
buffer:
  batch_size: 4
  total_steps: 100
  explorer_input:
    eval_tasksets: [{name: global_eval, path: /data/a}]
stages:
  - stage_name: sft
    mode: train
    algorithm: {algorithm_type: sft, optimizer: {lr: 5.0e-4}}
    buffer: {total_steps: null, total_epochs: 3}
  - stage_name: rl
    buffer:
      explorer_input:
        eval_tasksets: [{name: own_eval, path: /data/b}]
"""


def load(tmp_path, *overrides):
    path = os.path.join(tmp_path, "staged.yaml")
    with open(path, "w") as f:
        f.write(STAGED)
    return {s.name.split("_")[-1]: s for s in load_config(path, list(overrides)).stage_configs()}


def test_without_overrides_each_stage_keeps_its_own_values(tmp_path):
    stages = load(tmp_path)
    assert stages["sft"].buffer.total_steps is None and stages["rl"].buffer.total_steps == 100
    assert stages["sft"].algorithm.optimizer.lr == 5e-4
    assert stages["rl"].algorithm.optimizer.lr == 1e-5


def test_a_global_override_replaces_a_stage_value_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "buffer.total_steps=2")
    # the stage that set its own value (null) and the one that inherits both take it
    assert stages["sft"].buffer.total_steps == 2 and stages["rl"].buffer.total_steps == 2
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        "buffer.total_steps=2 (command line) replaces null, the value stage 'sft' sets; "
        "stages.0.buffer.total_steps=... sets one stage alone"
    ]


def test_the_stage_form_wins_over_the_global_form_without_a_note(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "stages.0.buffer.total_steps=7", "buffer.total_steps=2")
    assert stages["sft"].buffer.total_steps == 7 and stages["rl"].buffer.total_steps == 2
    assert caplog.records == []


def test_an_algorithm_override_reaches_a_stage_with_another_algorithm(tmp_path):
    # the sft stage does not inherit the global algorithm section (another algorithm_type),
    # yet a key the user typed reaches it
    stages = load(tmp_path, "algorithm.optimizer.weight_decay=0.05")
    assert stages["sft"].algorithm.optimizer.weight_decay == 0.05
    assert stages["sft"].algorithm.repeat_times == 1  # still sft's own defaults otherwise
    assert stages["rl"].algorithm.optimizer.weight_decay == 0.05


def test_an_override_below_a_stage_list_is_reported_as_missing_that_stage(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "buffer.explorer_input.eval_tasksets.0.split=valid")
    assert stages["sft"].buffer.explorer_input.eval_tasksets[0].split == "valid"
    assert stages["rl"].buffer.explorer_input.eval_tasksets[0].split == "train"  # its own list
    [note] = [r.getMessage() for r in caplog.records]
    assert "does not reach stage 'rl'" in note and "buffer.explorer_input.eval_tasksets" in note


def test_mode_explore_skips_a_train_only_stage(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "mode=explore")
    assert {name: s.mode for name, s in stages.items()} == {"rl": "explore"}
    [note] = [r.getMessage() for r in caplog.records]
    assert note.startswith("mode=explore (command line): stage 'sft' is skipped")


def test_a_skipped_stage_gets_no_note_about_its_values(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "buffer.total_steps=2", "mode=explore")
    assert list(stages) == ["rl"] and stages["rl"].buffer.total_steps == 2
    [note] = [r.getMessage() for r in caplog.records]
    assert "stage 'sft' is skipped" in note


def test_mode_train_keeps_the_train_stage_and_narrows_the_other(tmp_path):
    stages = load(tmp_path, "mode=train")
    assert {name: s.mode for name, s in stages.items()} == {"sft": "train", "rl": "train"}


def test_mode_colocate_keeps_a_train_only_stage_training(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        stages = load(tmp_path, "mode=colocate")
    assert {name: s.mode for name, s in stages.items()} == {"sft": "train", "rl": "colocate"}
    assert [r.getMessage() for r in caplog.records] == [
        "mode=colocate (command line): stage 'sft' keeps its own mode train"
    ]


def test_a_mode_that_leaves_no_stage_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="mode=explore .* leaves no stage to run"):
        load(tmp_path, "stages.1.mode=train", "mode=explore")


def test_the_quickstart_is_shortened_by_one_override():
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart")
    config = load_config(os.path.join(example, "arithmetic.yaml"), ["buffer.total_steps=2"])
    assert [s.buffer.total_steps for s in config.stage_configs()] == [2, 2]


@pytest.mark.parametrize(
    "item, message",
    [
        ("+buffer.batch_size=8", r"Hydra's \+key=value syntax .* write buffer.batch_size=8 "),
        ("++trainer.save_interval=5", "write trainer.save_interval=5 "),
        ("~buffer.total_steps", r"Hydra's ~key syntax .* write buffer.total_steps=null"),
    ],
)
def test_a_hydra_style_override_says_the_syntax_here(tmp_path, item, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, item)
