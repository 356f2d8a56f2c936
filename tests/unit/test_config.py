"""Loading configs: defaults, interpolation, overrides, error messages, stages, run names."""

import re
import textwrap

import pytest

from trinity.common.config import (
    ConfigError,
    FormatConfig,
    GenerationConfig,
    apply_run_name,
    load_config,
)


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def load_text(tmp_path, text, overrides=()):
    return load_config(write(tmp_path, text), list(overrides))


def problems_of(excinfo):
    return excinfo.value.problems


def test_minimal_yaml_gets_guide_defaults(tmp_path):
    config = load_text(tmp_path, "model:\n  model_path: /models/tiny\n")
    assert config.project == "Trinity-RFT"
    assert config.mode == "both"
    assert config.continue_from_checkpoint is True
    assert config.model.model_path == "/models/tiny"
    assert config.model.min_response_tokens == 1
    assert config.algorithm.optimizer.lr == 1e-6
    assert config.algorithm.optimizer.lr_scheduler_type == "constant"
    assert config.algorithm.optimizer.betas == (0.9, 0.999)
    assert config.buffer.total_epochs == 1
    assert config.explorer.runner_per_model == 8
    assert config.explorer.max_timeout == 900
    assert config.trainer.save_hf_checkpoint == "last"
    assert config.monitor.monitor_type == "tensorboard"
    assert config.log.level == "INFO"
    # Nothing is derived at load time: unset keys stay unset.
    assert config.buffer.train_batch_size is None
    assert config.model.max_model_len is None
    assert config.cluster.gpu_per_node is None
    assert config.explorer.rollout_model.engine_type is None
    assert config.ray_namespace is None


def test_format_and_generation_defaults():
    fmt, gen = FormatConfig(), GenerationConfig()
    assert (fmt.prompt_type, fmt.prompt_key, fmt.response_key) == (
        "plaintext",
        "prompt",
        "response",
    )
    assert (fmt.messages_key, fmt.tools_key) == ("message", "tools")
    assert (fmt.chosen_key, fmt.rejected_key) == ("chosen", "rejected")
    assert fmt.system_prompt_key is None and fmt.chat_template is None
    assert (gen.temperature, gen.top_p, gen.top_k, gen.n, gen.logprobs) == (1.0, 1.0, -1, 1, 0)
    assert gen.max_tokens is None and gen.stop is None


def test_env_interpolation_uses_default_when_unset(tmp_path, monkeypatch):
    text = "checkpoint_root_dir: ${oc.env:TRINITY_TEST_CKPT_ROOT,./ckpt}\n"
    monkeypatch.delenv("TRINITY_TEST_CKPT_ROOT", raising=False)
    assert load_text(tmp_path, text).checkpoint_root_dir == "./ckpt"
    monkeypatch.setenv("TRINITY_TEST_CKPT_ROOT", "/data/ckpt")
    assert load_text(tmp_path, text).checkpoint_root_dir == "/data/ckpt"


def test_missing_env_variable_names_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("TRINITY_TEST_NO_SUCH_VAR", raising=False)
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, "model:\n  model_path: ${oc.env:TRINITY_TEST_NO_SUCH_VAR}\n")
    assert "model.model_path" in str(excinfo.value)
    assert "TRINITY_TEST_NO_SUCH_VAR" in str(excinfo.value)


def test_key_interpolation(tmp_path):
    config = load_text(
        tmp_path,
        """
        model:
          model_path: /models/tiny
          critic_model_path: ${model.model_path}
        """,
    )
    assert config.model.critic_model_path == "/models/tiny"


def test_dotted_overrides_merge_on_top(tmp_path):
    text = """
    buffer:
      batch_size: 4
      explorer_input:
        tasksets:
          - name: a
            path: /old
            format: {prompt_key: q}
    """
    config = load_text(
        tmp_path,
        text,
        [
            "buffer.batch_size=16",
            "algorithm.optimizer.lr=1e-5",
            "buffer.explorer_input.tasksets.0.path=/new",
            "monitor.monitor_args={project: x}",
            "model.max_prompt_tokens=null",
        ],
    )
    assert config.buffer.batch_size == 16
    assert config.algorithm.optimizer.lr == 1e-5
    taskset = config.buffer.explorer_input.tasksets[0]
    assert (taskset.name, taskset.path, taskset.format.prompt_key) == ("a", "/new", "q")
    assert config.monitor.monitor_args == {"project": "x"}


def test_malformed_override_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_text(tmp_path, "project: p\n", ["buffer.batch_size"])


def test_unknown_keys_all_reported_with_suggestions(tmp_path):
    text = """
    buffer:
      batchsize: 8
    model:
      modle_path: /m
    explorer:
      rollout_model:
        engine_typ: transformers
    """
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, text)
    problems = problems_of(excinfo)
    assert len(problems) == 3
    assert any("buffer.batchsize" in p and "did you mean 'batch_size'?" in p for p in problems)
    assert any("model.modle_path" in p and "'model_path'" in p for p in problems)
    assert any("explorer.rollout_model.engine_typ" in p and "'engine_type'" in p for p in problems)


def test_unknown_verl_key_names_full_path(tmp_path):
    text = """
    trainer:
      trainer_config:
        actor_rollout_ref:
          actor:
            ppo_micro_batch_sise: 4
    """
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, text)
    (problem,) = problems_of(excinfo)
    assert problem.startswith(
        "trainer.trainer_config.actor_rollout_ref.actor.ppo_micro_batch_sise: unknown key"
    )
    assert "did you mean 'ppo_micro_batch_size_per_gpu'?" in problem


def test_moved_verl_key_points_to_its_trinity_home(tmp_path):
    text = """
    trainer:
      trainer_config:
        actor_rollout_ref:
          actor:
            ppo_micro_batch_size: 8
    """
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, text)
    assert "set 'ppo_micro_batch_size_per_gpu' instead" in problems_of(excinfo)[0]


def test_wrong_types_name_path_expected_type_and_value(tmp_path):
    text = """
    buffer:
      batch_size: many
      explorer_input:
        tasksets:
          - path: /d
            repeat_times: [1]
    synchronizer:
      sync_style: sometimes
    """
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, text)
    problems = problems_of(excinfo)
    assert any(p.startswith("buffer.batch_size: expected int, got 'many'") for p in problems)
    assert any(
        p.startswith("buffer.explorer_input.tasksets[0].repeat_times: expected int or null")
        for p in problems
    )
    assert any(
        p.startswith("synchronizer.sync_style: expected one of 'fixed'") and "'sometimes'" in p
        for p in problems
    )


def test_a_misspelled_choice_gets_the_closest_one(tmp_path):
    text = """
    mode: explor
    trainer: {save_hf_checkpoint: alway}
    """
    with pytest.raises(ConfigError) as excinfo:
        load_text(tmp_path, text)
    assert sorted(problems_of(excinfo)) == [
        "mode: expected one of 'both', 'train', 'explore', 'bench', 'colocate', 'serve', got "
        "'explor'; did you mean 'explore'?",
        "trainer.save_hf_checkpoint: expected one of 'last', 'always', 'never', got 'alway'; "
        "did you mean 'always'?",
    ]


def test_taskset_single_form_becomes_list(tmp_path):
    config = load_text(tmp_path, "buffer:\n  explorer_input:\n    taskset: {name: t, path: /d}\n")
    inputs = config.buffer.explorer_input
    assert [t.name for t in inputs.tasksets] == ["t"]
    assert inputs.taskset is inputs.tasksets[0]


def test_taskset_and_tasksets_together_is_an_error(tmp_path):
    text = """
    buffer:
      explorer_input:
        taskset: {path: /a}
        tasksets: [{path: /b}]
    """
    match = "buffer.explorer_input: set either `tasksets` or its alias `taskset`, not both"
    with pytest.raises(ConfigError, match=match):
        load_text(tmp_path, text)


def test_none_string_means_null_for_nullable_keys(tmp_path):
    # The guide's model example writes `custom_chat_template: None`.
    config = load_text(tmp_path, "model:\n  custom_chat_template: None\n  model_path: None\n")
    assert config.model.custom_chat_template is None
    assert config.model.model_path == "None"  # not nullable: kept as written


def test_a_null_section_takes_its_defaults(tmp_path):
    # The guide's trainer example ends with `trainer_config: null`; an emptied `monitor:`
    # reads as null too.
    config = load_text(tmp_path, "trainer:\n  trainer_config: null\nmonitor:\n")
    assert config.trainer.trainer_config.trainer.balance_batch is True
    assert config.monitor.monitor_type == "tensorboard"
    with pytest.raises(ConfigError) as info:  # a value that is not a mapping still is not
        load_text(tmp_path, "trainer:\n  trainer_config: 3\n")
    assert "trainer.trainer_config: expected a mapping" in problems_of(info)[0]


def test_verl_keys_pasted_inline_interpolate_within_their_tree(tmp_path):
    # The guide's veRL block refers to its own keys (`${actor_rollout_ref.actor...}`), as a
    # veRL file does; under trainer.trainer_config those keys live deeper.
    text = """
    model: {max_prompt_tokens: 100}
    trainer:
      trainer_config:
        actor_rollout_ref:
          actor: {use_dynamic_bsz: false, ppo_max_token_len_per_gpu: 999}
          ref:
            log_prob_use_dynamic_bsz: ${actor_rollout_ref.actor.use_dynamic_bsz}
            log_prob_max_token_len_per_gpu: ${model.max_prompt_tokens}
    stages:
      - stage_name: a
        trainer:
          trainer_config:
            critic:
              ppo_max_token_len_per_gpu: 7
              forward_max_token_len_per_gpu: ${critic.ppo_max_token_len_per_gpu}
    """
    config = load_text(tmp_path, text)
    ref = config.trainer.trainer_config.actor_rollout_ref.ref
    assert ref.log_prob_use_dynamic_bsz is False
    assert ref.log_prob_max_token_len_per_gpu == 100  # not in the tree: from the top
    assert config.stages[0].trainer.trainer_config.critic.forward_max_token_len_per_gpu == 7


def test_checkpoint_job_dir(tmp_path):
    config = load_text(tmp_path, "project: p\nname: n\ncheckpoint_root_dir: /ck\n")
    assert config.checkpoint_job_dir == "/ck/p/n"


def test_apply_run_name_adds_timestamp_only_for_new_runs(tmp_path):
    fresh = load_text(tmp_path, "name: exp\ncontinue_from_checkpoint: false\n")
    renamed = apply_run_name(fresh)
    assert re.fullmatch(r"exp_\d{14}", renamed.name)
    assert fresh.name == "exp"  # the input is not modified
    resumed = load_text(tmp_path, "name: exp\n")
    assert apply_run_name(resumed).name == "exp"


STAGES = """
name: exp
algorithm:
  algorithm_type: grpo
  repeat_times: 8
  kl_loss_fn: k3
  optimizer: {lr: 2e-6}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: math, path: /rl}
  trainer_input:
    experience_buffer: {name: exp_buffer, storage_type: queue}
stages:
  - stage_name: sft_warmup
    mode: train
    algorithm:
      algorithm_type: sft
    buffer:
      train_batch_size: 64
      total_steps: 100
      trainer_input:
        experience_buffer:
          name: sft_buffer
          storage_type: file
          path: /sft
  - stage_name: rft
  - stage_name: rft_slow
    algorithm:
      optimizer: {lr: 1e-7}
"""


def test_stage_configs_deep_merge_over_global(tmp_path):
    sft, rft, slow = load_text(tmp_path, STAGES).stage_configs()
    assert [c.name for c in (sft, rft, slow)] == ["exp_sft_warmup", "exp_rft", "exp_rft_slow"]
    assert all(c.stages == [] for c in (sft, rft, slow))
    # Stage keys override, the rest of the section is inherited.
    assert sft.mode == "train"
    assert (sft.buffer.batch_size, sft.buffer.train_batch_size, sft.buffer.total_steps) == (
        4,
        64,
        100,
    )
    buffer = sft.buffer.trainer_input.experience_buffer
    assert (buffer.name, buffer.storage_type, buffer.path) == ("sft_buffer", "file", "/sft")
    assert sft.buffer.explorer_input.tasksets[0].path == "/rl"
    # A new algorithm type does not inherit the other algorithm's components.
    assert sft.algorithm.algorithm_type == "sft"
    assert sft.algorithm.kl_loss_fn is None and sft.algorithm.repeat_times == 1
    assert sft.algorithm.optimizer.lr == 1e-6
    # An empty stage is the global config renamed; a same-type stage merges key by key.
    assert rft.mode == "both" and rft.algorithm.repeat_times == 8
    assert rft.buffer.trainer_input.experience_buffer.name == "exp_buffer"
    assert (slow.algorithm.optimizer.lr, slow.algorithm.kl_loss_fn) == (1e-7, "k3")
    assert slow.algorithm.repeat_times == 8


def test_no_stages_means_the_config_itself(tmp_path):
    config = load_text(tmp_path, "name: exp\n")
    assert config.stage_configs() == [config]


def test_stage_unknown_key_missing_name_and_duplicate_names(tmp_path):
    bad_key = "stages:\n  - stage_name: a\n    buffer: {batchsize: 3}\n"
    with pytest.raises(ConfigError, match=r"stages\[0\]\.buffer\.batchsize: unknown key"):
        load_text(tmp_path, bad_key)
    with pytest.raises(ConfigError, match=r"stages\[0\]\.stage_name: required key is missing"):
        load_text(tmp_path, "stages:\n  - mode: train\n")
    twice = "stages:\n  - stage_name: a\n  - stage_name: a\n"
    with pytest.raises(ConfigError, match=r"stages: stage_name must be unique, repeated: \['a'\]"):
        load_text(tmp_path, twice)


def test_every_field_is_documented():
    # The one-line description is what --help style explanations and the docs show.
    from trinity.common.config import ConfigModel

    classes, pending = set(), [ConfigModel]
    while pending:
        for sub in pending.pop().__subclasses__():
            classes.add(sub)
            pending.append(sub)
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, field in cls.model_fields.items()
        if not field.description
    ]
    assert len(classes) > 30 and undocumented == []


def test_tinker_keys_are_read_not_reported_as_doing_nothing(tmp_path):
    from trinity.common.config.base import explicit_inert_values

    config = load_text(tmp_path, "model:\n  tinker: {rank: 8, train_mlp: false}\n")
    assert (config.model.tinker.rank, config.model.tinker.train_mlp) == (8, False)
    assert explicit_inert_values(config) == []
