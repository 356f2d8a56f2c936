"""Finalizing configs: derived values, never overriding the user, support and range checks,
veRL key mapping, and the two align-with-verl.md examples."""

import logging
import os
import textwrap

import pytest
import yaml

import trinity.common.config.gpus as gpus_module
from trinity import algorithm
from trinity.common.config import (
    ConfigError,
    effective_trainer_settings,
    load_config,
    save_resolved_config,
)
from trinity.preflight.derive import finalize

CONFIGS = os.path.join(os.path.dirname(__file__), "configs")


def _component(name, args):
    return type(name, (), {"default_args": classmethod(lambda cls: dict(args))})


def _algorithm(name, defaults, **flags):
    attrs = {"default_config": classmethod(lambda cls: dict(defaults)), **flags}
    return type(name, (), attrs)


@pytest.fixture(autouse=True)
def fake_algorithms(monkeypatch):
    """trinity.algorithm's registries holding stand-ins: grpo and sft and their components,
    so the expected defaults and "supported" lists are this file's, not the built-ins'."""
    grpo = {
        "repeat_times": 2,
        "sample_strategy": "default",
        "policy_loss_fn": "ppo",
        "advantage_fn": "grpo",
        "kl_penalty_fn": "none",
        "kl_loss_fn": "k2",
        "entropy_loss_fn": "default",
    }
    sft = {"repeat_times": 1, "policy_loss_fn": "sft", "kl_loss_fn": "none"}
    components = {
        "SAMPLE_STRATEGY": {"default": {}},
        "ADVANTAGE_FN": {"grpo": {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": True}},
        "POLICY_LOSS_FN": {"ppo": {"clip_range": 0.2, "loss_agg_mode": "token-mean"}, "sft": {}},
        "KL_FN": {name: {"kl_coef": 0.001} for name in ("none", "k1", "k2", "k3", "low_var_kl")},
        "ENTROPY_LOSS_FN": {"default": {"entropy_coef": 0.0}},
    }
    for registry_name in ("ALGORITHM_TYPE", *components):
        # emptied for the test (monkeypatch restores the built-ins), then filled below
        monkeypatch.setattr(getattr(algorithm, registry_name), "_modules", {})
    algorithm.ALGORITHM_TYPE.register_module("grpo", _algorithm("GRPO", grpo))
    algorithm.ALGORITHM_TYPE.register_module("sft", _algorithm("SFT", sft, use_advantage=False))
    for registry_name, entries in components.items():
        registry = getattr(algorithm, registry_name)
        for name, args in entries.items():
            registry.register_module(name, _component(name, args))
    # grpo compares the rollouts of a task: the group checks read this declaration.
    algorithm.ADVANTAGE_FN.get("grpo").needs_groups = True
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 0)


BASE = """
project: proj
name: exp
checkpoint_root_dir: /ck
model:
  model_path: /models/tiny
  max_prompt_tokens: 100
  max_response_tokens: 28
buffer:
  batch_size: 4
  explorer_input:
    default_workflow_type: math_workflow
    default_eval_workflow_type: eval_workflow
    default_reward_fn_type: math_reward
    taskset: {name: train, path: /data}
    eval_tasksets:
      - {name: test, path: /data, split: test}
"""


def load(tmp_path, text=BASE, overrides=()):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return load_config(str(path), list(overrides))


def finalized(tmp_path, text=BASE, overrides=()):
    return finalize(load(tmp_path, text, overrides))


def problems(tmp_path, text=BASE, overrides=()):
    with pytest.raises(ConfigError) as excinfo:
        finalized(tmp_path, text, overrides)
    return excinfo.value.problems


def test_derived_values(tmp_path):
    config = finalized(tmp_path)
    # grpo's default_config gives repeat_times 2 (not set by the user).
    assert config.algorithm.repeat_times == 2
    assert config.buffer.train_batch_size == 4 * 2
    assert config.model.max_model_len == 100 + 28
    assert config.model.critic_model_path == "/models/tiny"
    assert config.ray_namespace == "proj/exp"
    train = config.buffer.explorer_input.tasksets[0]
    assert (train.repeat_times, train.rollout_args.n, train.rollout_args.max_tokens) == (2, 2, 28)
    assert (train.default_workflow_type, train.default_reward_fn_type) == (
        "math_workflow",
        "math_reward",
    )
    assert train.is_eval is False
    test = config.buffer.explorer_input.eval_tasksets[0]
    assert (test.repeat_times, test.rollout_args.n, test.is_eval) == (1, 1, True)
    assert (test.default_workflow_type, test.default_reward_fn_type) == (
        "eval_workflow",
        "math_reward",
    )
    experience = config.buffer.trainer_input.experience_buffer
    assert (experience.name, experience.storage_type) == ("experience_buffer", "queue")
    rollout = config.explorer.rollout_model
    assert (rollout.model_path, rollout.max_model_len, rollout.max_response_tokens) == (
        "/models/tiny",
        128,
        28,
    )


def test_defaults_follow_the_machine(tmp_path):
    config = finalized(tmp_path)
    assert config.cluster.gpu_per_node == 0
    assert config.explorer.rollout_model.engine_type == "transformers"
    assert config.explorer.rollout_model.dtype == "float32"
    assert config.synchronizer.sync_method == "memory"  # mode both
    assert config.trainer.max_token_len_per_gpu == 16384  # max(16384, 128)


def test_algorithm_components_and_args(tmp_path):
    text = BASE + textwrap.dedent(
        """
        algorithm:
          kl_loss_fn: k1
          kl_loss_fn_args: {kl_coef: 0.5}
          loss_agg_mode: seq-mean-token-mean
        """
    )
    algorithm = finalized(tmp_path, text).algorithm
    assert (algorithm.policy_loss_fn, algorithm.advantage_fn) == ("ppo", "grpo")
    assert algorithm.kl_loss_fn == "k1"  # user value kept over grpo's k2
    assert algorithm.kl_loss_fn_args == {"kl_coef": 0.5}
    # algorithm.loss_agg_mode reaches every loss whose arguments take one.
    assert algorithm.policy_loss_fn_args == {
        "clip_range": 0.2,
        "loss_agg_mode": "seq-mean-token-mean",
    }
    assert algorithm.entropy_loss_fn_args == {"entropy_coef": 0.0}


def test_explicit_values_are_never_overridden(tmp_path):
    text = BASE + textwrap.dedent(
        """
        ray_namespace: my_ns
        mode: both
        cluster: {gpu_per_node: 0}
        synchronizer: {sync_method: checkpoint}
        algorithm: {repeat_times: 5}
        trainer: {max_token_len_per_gpu: 4096}
        explorer:
          rollout_model: {max_response_tokens: 20, dtype: bfloat16}
        """
    )
    overrides = [
        "buffer.train_batch_size=10",
        "model.max_model_len=200",
        "buffer.explorer_input.taskset.repeat_times=3",
        "buffer.explorer_input.taskset.rollout_args.temperature=0.7",
        "buffer.explorer_input.taskset.default_workflow_type=my_workflow",
        "buffer.explorer_input.eval_tasksets.0.repeat_times=4",
    ]
    config = finalized(tmp_path, text, overrides)
    assert config.ray_namespace == "my_ns"
    assert config.cluster.gpu_per_node == 0
    assert config.synchronizer.sync_method == "checkpoint"
    assert config.algorithm.repeat_times == 5
    assert config.buffer.train_batch_size == 10
    assert config.model.max_model_len == 200
    assert config.trainer.max_token_len_per_gpu == 4096
    assert config.explorer.rollout_model.max_response_tokens == 20
    assert config.explorer.rollout_model.dtype == "bfloat16"
    train = config.buffer.explorer_input.tasksets[0]
    assert (train.repeat_times, train.rollout_args.n, train.rollout_args.temperature) == (3, 3, 0.7)
    assert train.default_workflow_type == "my_workflow"
    test = config.buffer.explorer_input.eval_tasksets[0]
    assert (test.repeat_times, test.rollout_args.n) == (4, 4)


def test_derived_values_are_not_marked_as_user_set(tmp_path):
    config = finalized(tmp_path)
    assert "train_batch_size" not in config.buffer.model_fields_set
    assert "repeat_times" not in config.algorithm.model_fields_set
    assert finalize(config).model_dump() == config.model_dump()  # idempotent


def test_model_temperature_applies_to_tasksets_without_their_own(tmp_path):
    overrides = [
        "model.temperature=0.5",
        "buffer.explorer_input.eval_tasksets.0.rollout_args.temperature=0",
    ]
    config = finalized(tmp_path, overrides=overrides)
    assert config.buffer.explorer_input.tasksets[0].rollout_args.temperature == 0.5
    assert config.buffer.explorer_input.eval_tasksets[0].rollout_args.temperature == 0.0


def test_chat_template_path_overrides_custom_template(tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages }}")
    config = finalized(tmp_path, overrides=[f"model.chat_template_path={template}"])
    assert config.model.custom_chat_template == "{{ messages }}"
    assert config.buffer.explorer_input.tasksets[0].format.chat_template == "{{ messages }}"
    assert config.explorer.rollout_model.chat_template == "{{ messages }}"


def test_total_steps_copied_both_ways(tmp_path):
    config = finalized(tmp_path, overrides=["buffer.total_steps=7"])
    assert config.trainer.total_steps == 7
    config = finalized(tmp_path, overrides=["trainer.total_steps=9"])
    assert config.buffer.total_steps == 9
    found = problems(tmp_path, overrides=["trainer.total_steps=9", "buffer.total_steps=8"])
    assert found == ["buffer.total_steps = 8 and trainer.total_steps = 9 disagree; set one of them"]


def test_max_model_len_needs_its_parts(tmp_path):
    found = problems(tmp_path, overrides=["model.max_prompt_tokens=null"])
    assert any(p.startswith("model.max_model_len is unset and cannot be derived") for p in found)


def test_sync_method_follows_mode(tmp_path, caplog):
    sft = """
    model: {model_path: /m, max_model_len: 64}
    mode: train
    algorithm: {algorithm_type: sft}
    buffer:
      batch_size: 2
      trainer_input:
        experience_buffer: {name: sft_data, path: /sft}
    """
    config = finalized(tmp_path, sft)
    assert config.synchronizer.sync_method == "checkpoint"
    assert config.buffer.trainer_input.experience_buffer.storage_type == "file"
    assert config.buffer.train_batch_size == 2  # sft: repeat_times 1
    # a sync method or style (written for mode both) means nothing in mode train: ignored
    overrides = ["synchronizer.sync_method=nccl", "synchronizer.sync_style=explorer_driven"]
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, sft, overrides)
    assert config.synchronizer.sync_method == "checkpoint"
    assert config.synchronizer.sync_style == "fixed"
    [line] = [r.getMessage() for r in caplog.records if "ignored in mode train" in r.getMessage()]
    assert line.startswith(
        "synchronizer.sync_method = nccl, synchronizer.sync_style = explorer_driven: ignored in "
        "mode train"
    )


@pytest.mark.parametrize("mode", ["colocate"])
def test_nccl_sync_needs_mode_both(tmp_path, mode):
    """In the other modes that sync (in train, explore and bench it is ignored, one line)."""
    found = problems(tmp_path, overrides=[f"mode={mode}", "synchronizer.sync_method=nccl"])
    assert (
        "synchronizer.sync_method = nccl needs mode both (the trainer broadcasts to the rollout "
        f"engines of its own run, each in a process of its own); with mode {mode} use memory"
    ) in found


def test_not_supported_values_are_reported_together(tmp_path):
    overrides = [
        "algorithm.algorithm_type=dpo",
        "trainer.trainer_strategy=megatron",
        "monitor.monitor_type=neptune",
        "buffer.explorer_input.taskset.storage_type=queue",
        "model.lora_configs=[{lora_dtype: int8}]",
    ]
    found = problems(tmp_path, overrides=overrides)
    expected_starts = [
        "algorithm.algorithm_type = dpo is not supported yet (supported: grpo, sft)",
        "model.lora_configs[0].lora_dtype = int8 is not supported yet (supported: auto, "
        "float32, bfloat16, float16)",
        "buffer.explorer_input.tasksets[0].storage_type = queue is not supported yet "
        "(supported: file, reasoning_gym, sql)",
        "trainer.trainer_strategy = megatron is not supported yet: the Megatron backend is not "
        "built; the trainer shards with FSDP2 (supported: fsdp, fsdp2)",
        "monitor.monitor_type: unknown monitor_type 'neptune' (known: mlflow, tensorboard, wandb)",
    ]
    assert len(found) == len(expected_starts)
    for problem, start in zip(found, expected_starts, strict=True):
        assert problem.startswith(start), problem


def test_a_name_registered_nowhere_is_unknown_with_the_closest_not_a_planned_feature(tmp_path):
    """ "not supported yet" is for names the configuration guide documents (dpo, tinker); a
    misspelled one is unknown and gets the nearest valid name, as misspelled keys do."""
    overrides = [
        "algorithm.algorithm_type=grpoo",
        "explorer.rollout_model.engine_type=transformer",
        "monitor.monitor_type=wandbb",
        "buffer.explorer_input.taskset.storage_type=fiel",
        "buffer.trainer_input.experience_buffer={name: e, storage_type: sqll}",
    ]
    plugin = "; a plugin's class is registered once its file is loaded with --plugin-dir"
    assert problems(tmp_path, overrides=overrides) == [
        "algorithm.algorithm_type: unknown algorithm_type 'grpoo'; did you mean 'grpo'? "
        "(known: grpo, sft)" + plugin,
        "buffer.explorer_input.tasksets[0].storage_type: unknown storage_type 'fiel'; did you "
        "mean 'file'? (known: file, reasoning_gym, sql)" + plugin,
        "buffer.trainer_input.experience_buffer.storage_type: unknown storage_type 'sqll'; did "
        "you mean 'sql'? (known: queue, sql)" + plugin,
        "explorer.rollout_model.engine_type: unknown engine_type 'transformer'; did you mean "
        "'transformers'? (known: transformers, external, tinker, vllm, unset)" + plugin,
        "monitor.monitor_type: unknown monitor_type 'wandbb'; did you mean 'wandb'? (known: "
        "mlflow, tensorboard, wandb)" + plugin,
    ]
    with pytest.raises(ConfigError) as info:
        finalized(tmp_path, overrides=["explorer.auxiliary_models=[{engine_type: tinker}]"])
    assert info.value.problems == [
        "explorer.auxiliary_models[0].engine_type = tinker is not supported yet: the tinker "
        "engine serves only the rollout model (the adapter a Tinker run trains) (supported: "
        "transformers, external, vllm, unset)"
    ]
    assert "not built yet" in str(info.value)


def test_experience_buffer_storage_depends_on_mode(tmp_path):
    found = problems(
        tmp_path, overrides=["buffer.trainer_input.experience_buffer={name: e, path: /e}"]
    )
    assert found == [
        "buffer.trainer_input.experience_buffer.storage_type = file is not supported yet "
        "(supported: queue, sql)"
    ]


def test_impossible_arithmetic_is_reported_together(tmp_path):
    # each field's own bounds, checked when the config is read: all of them at once
    bounds = ["buffer.batch_size=0", "buffer.train_batch_size=0"]
    bounds += ["synchronizer.sync_interval=0", "synchronizer.sync_offset=-1"]
    with pytest.raises(ConfigError) as excinfo:
        load(tmp_path, overrides=bounds)
    assert excinfo.value.problems == [
        "buffer.batch_size = 0 must be >= 1",
        "buffer.train_batch_size = 0 must be >= 1",
        "synchronizer.sync_interval = 0 must be >= 1",
        "synchronizer.sync_offset = -1 must be >= 0",
    ]
    # then the relations between keys, after derivation: all of them at once
    overrides = [
        "algorithm.repeat_times=1",
        "model.min_response_tokens=28",
        "model.max_model_len=110",
        "buffer.explorer_input.taskset.rollout_args.n=3",
    ]
    found = problems(tmp_path, overrides=overrides)
    assert found == [
        "model.min_response_tokens = 28 must be less than model.max_response_tokens = 28",
        "model.max_prompt_tokens + model.min_response_tokens = 100 + 28 exceeds "
        "model.max_model_len = 110",
        "algorithm.repeat_times = 1: grpo compares several rollouts of each task, so it needs "
        "repeat_times > 1",
    ]


def test_unregistered_component_is_an_error(tmp_path):
    found = problems(tmp_path, overrides=["algorithm.advantage_fn=gae"])
    assert len(found) == 1
    assert found[0].startswith("algorithm.advantage_fn = gae: advantage_fn has no module named")


def test_storage_names_are_unique_among_their_kind(tmp_path):
    # a training and an eval taskset may share a name (nothing keys both by it)
    finalized(tmp_path, overrides=["buffer.explorer_input.eval_tasksets.0.name=train"])
    twice = "[{name: test, path: /data, split: test}, {name: test, path: /data, split: test}]"
    found = problems(tmp_path, overrides=[f"buffer.explorer_input.eval_tasksets={twice}"])
    assert found == [
        "buffer.explorer_input.eval_tasksets[1].name = test is also used by "
        "buffer.explorer_input.eval_tasksets[0]: eval tasksets are told apart by name (their "
        "eval/<name>/ metrics); rename one"
    ]


VERL = """
trainer:
  trainer_config:
    actor_rollout_ref:
      actor:
        grad_clip: 0.5
        ppo_micro_batch_size_per_gpu: 2
        optim: {lr: 3e-6, warmup_style: cosine}
      rollout:
        n: 4
"""


def test_verl_keys_map_onto_the_native_trainer(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, BASE + VERL)
    assert config.trainer.grad_clip == 0.5
    assert config.algorithm.optimizer.lr == 3e-6
    assert config.algorithm.optimizer.lr_scheduler_type == "cosine"
    settings = effective_trainer_settings(config)
    assert settings["micro_batch_size_per_device"] == 2
    assert settings["grad_clip"] == 0.5
    assert settings["ref_max_token_len_per_device"] == config.trainer.max_token_len_per_gpu
    assert settings["critic"]["optimizer"].lr == 1e-5
    assert settings["critic"]["ppo_epochs"] == 1
    # rollout keys are accepted but have no effect: the warning names them and their home.
    assert "trainer.trainer_config.actor_rollout_ref.rollout.n = 4" in caplog.text
    assert "set algorithm.repeat_times" in caplog.text


def test_keys_without_effect_here_are_named_in_the_warning(tmp_path, caplog):
    overrides = [
        "trainer.save_strategy=single_node",
        "ignore_validator_suggestions=true",
        "trainer.trainer_config.actor_rollout_ref.actor.shuffle=true",
    ]
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, BASE, overrides)
    assert "trainer.save_strategy = single_node" in caplog.text
    assert "ignore_validator_suggestions = true" in caplog.text
    assert "trainer.trainer_config.actor_rollout_ref.actor.shuffle = true" in caplog.text
    assert "shuffle" not in effective_trainer_settings(config)  # nothing reads it


def test_verl_key_conflicting_with_trinity_key_is_an_error(tmp_path):
    found = problems(tmp_path, BASE + VERL.replace("trainer:\n", "trainer:\n  grad_clip: 2.0\n"))
    assert found == [
        "trainer.trainer_config.actor_rollout_ref.actor.grad_clip = 0.5 conflicts with "
        "trainer.grad_clip = 2.0; set only trainer.grad_clip"
    ]


def test_a_command_line_key_wins_over_the_file_key_of_the_same_setting(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, BASE + VERL, ["trainer.grad_clip=2.0"])
    assert config.trainer.grad_clip == 2.0
    assert (
        "trainer.grad_clip=2.0 (command line) is used, not "
        "trainer.trainer_config.actor_rollout_ref.actor.grad_clip: 0.5 from the file: the two "
        "keys set one setting"
    ) in caplog.text


def example(name):
    return os.path.join(CONFIGS, name)


EXAMPLE_OVERRIDES = [
    "model.model_path=/models/tiny",
    "cluster.gpu_per_node=0",
    "buffer.explorer_input.tasksets.0.path=/data/gsm8k",
    "buffer.explorer_input.eval_tasksets.0.path=/data/gsm8k",
]


def test_grpo_example_validates(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalize(load_config(example("grpo_example.yaml"), EXAMPLE_OVERRIDES))
    assert config.algorithm.algorithm_type == "grpo"
    assert config.monitor.monitor_type == "wandb"
    assert (config.algorithm.repeat_times, config.buffer.train_batch_size) == (8, 2048)
    assert config.algorithm.kl_loss_fn == "low_var_kl"
    assert config.algorithm.kl_loss_fn_args == {"kl_coef": 0.001}
    assert config.algorithm.entropy_loss_fn_args == {"entropy_coef": 0}
    assert config.model.max_model_len == 1024
    assert config.buffer.explorer_input.tasksets[0].rollout_args.n == 8
    assert config.buffer.explorer_input.eval_tasksets[0].rollout_args.n == 1
    assert effective_trainer_settings(config)["max_token_len_per_device"] == 24000
    assert "ref.fsdp_config.param_offload = true" in caplog.text


def test_ppo_example_fails_only_on_unbuilt_features():
    """Its reward model (explorer.auxiliary_models) is served like any auxiliary model now;
    only ppo itself is missing from this test's registry: the algorithm type and the
    advantage fn the example names (the rest of the config is still checked)."""
    config = load_config(example("ppo_example.yaml"), EXAMPLE_OVERRIDES)
    with pytest.raises(ConfigError) as excinfo:
        finalize(config)
    algorithm_type, advantage_fn = excinfo.value.problems
    assert algorithm_type.startswith("algorithm.algorithm_type = ppo is not supported yet")
    assert advantage_fn.startswith("algorithm.advantage_fn = ppo: advantage_fn has no module")
    assert excinfo.value.incomplete


def test_saved_config_reloads_to_the_same_config(tmp_path):
    config = finalized(tmp_path, BASE + VERL + "stages:\n  - stage_name: only\n")
    path = tmp_path / "out" / "config.yaml"
    save_resolved_config(config, str(path))
    text = path.read_text()
    assert "train_batch_size: 8" in text and "sync_method: memory" in text
    saved = yaml.safe_load(text)["trainer"]["trainer_config"]["actor_rollout_ref"]
    # derived for this machine (no GPU) though the user wrote no veRL dtype
    assert saved["actor"]["fsdp_config"]["mixed_precision"]["param_dtype"] == "fp32"
    assert saved["ref"]["fsdp_config"]["mixed_precision"]["param_dtype"] == "fp32"
    reloaded = finalize(load_config(str(path)))
    assert reloaded.model_dump() == config.model_dump()


def test_train_mode_needs_an_experience_buffer(tmp_path):
    text = "mode: train\nmodel: {model_path: /m, max_model_len: 64}\n"
    text += "algorithm: {algorithm_type: sft}\n"
    assert problems(tmp_path, text) == [
        "buffer.trainer_input.experience_buffer is required in mode train"
    ]


def test_rollout_engine_gets_its_dtype_and_seed(tmp_path):
    from trinity.runtime.explorer_role import engine_kwargs

    default = engine_kwargs(finalized(tmp_path))
    assert (default["dtype"], default["seed"]) == ("float32", 42)
    chosen_keys = "{dtype: bfloat16, seed: 7, enable_thinking: true, reasoning_parser: qwen3}"
    text = BASE + f"explorer:\n  rollout_model: {chosen_keys}\n"
    chosen = engine_kwargs(finalized(tmp_path, text))
    assert (chosen["dtype"], chosen["seed"]) == ("bfloat16", 7)
    assert (default["enable_thinking"], chosen["enable_thinking"]) == (False, True)
    assert (default["reasoning_parser"], chosen["reasoning_parser"]) == (None, "qwen3")
    assert default["tool_call_parser"] == "hermes"


# ---- decoupled runs: a train run reading the store of a separate explore run ---------------
TRAIN_FROM_STORE = """
model: {model_path: /m, max_model_len: 64}
mode: train
buffer:
  batch_size: 2
  trainer_input:
    experience_buffer: {name: eb, storage_type: queue}
"""


def test_a_train_run_reads_the_store_of_an_explore_run(tmp_path):
    from trinity.preflight.decoupled import resolved_config_name

    config = finalized(tmp_path, TRAIN_FROM_STORE, ["buffer.total_steps=3"])
    assert config.synchronizer.sync_method == "checkpoint"  # the explorer reads checkpoints
    assert resolved_config_name(config) == "train_config.yaml"
    sql = "buffer.trainer_input.experience_buffer.storage_type=sql"
    assert finalized(tmp_path, TRAIN_FROM_STORE, ["buffer.total_steps=3", sql])
    # with the explorer's taskset the steps are counted as the explorer does
    assert finalized(
        tmp_path,
        overrides=[
            "mode=train",
            "buffer.trainer_input.experience_buffer={name: eb, storage_type: queue}",
        ],
    )
    assert problems(tmp_path, TRAIN_FROM_STORE) == [
        "buffer.total_steps is required in mode train with buffer.trainer_input."
        "experience_buffer.storage_type = queue (or give the explorer's "
        "buffer.explorer_input.taskset, to count the steps as the explorer does)"
    ]
    explore = finalized(tmp_path, overrides=["mode=explore"])
    assert resolved_config_name(explore) == "explore_config.yaml"
    assert resolved_config_name(finalized(tmp_path)) == "config.yaml"


# ---- GPUs ------------------------------------------------------------------------------------
def _precisions(config):
    verl = config.trainer.trainer_config
    sections = (verl.actor_rollout_ref.actor, verl.actor_rollout_ref.ref, verl.critic.model)
    return {s.fsdp_config.mixed_precision.param_dtype for s in sections}


def test_precision_follows_the_machine(tmp_path, monkeypatch):
    cpu = finalized(tmp_path)
    assert (cpu.explorer.rollout_model.dtype, _precisions(cpu)) == ("float32", {"fp32"})
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 1)
    gpu = finalized(tmp_path)
    assert gpu.cluster.gpu_per_node == 1
    assert (gpu.explorer.rollout_model.dtype, _precisions(gpu)) == ("bfloat16", {"bf16"})
    settings = effective_trainer_settings(gpu)
    assert (settings["param_dtype"], settings["ref_param_dtype"]) == ("bf16", "bf16")
    assert settings["critic"]["param_dtype"] == "bf16"
    chosen = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.mixed_precision"
    kept = finalized(tmp_path, overrides=[f"{chosen}.param_dtype=fp32"])
    assert effective_trainer_settings(kept)["param_dtype"] == "fp32"


def test_gpu_count_is_checked_against_the_machine(tmp_path, monkeypatch):
    assert problems(tmp_path, overrides=["cluster.gpu_per_node=8"]) == [
        "cluster.gpu_per_node = 8 but this machine has 0 GPU(s) visible to torch (a CPU-only "
        "torch build, or CUDA_VISIBLE_DEVICES empty); the stage fits on its CPUs"
    ]
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 3)
    assert finalized(tmp_path, overrides=["cluster.gpu_per_node=2"]).cluster.gpu_per_node == 2
    (found,) = problems(tmp_path, overrides=["cluster.gpu_per_node=3"])  # the trainer gets 2
    assert "leave 2 of cluster.node_num (1) x cluster.gpu_per_node (3) = 3 for the trainer" in found
    assert "a trainer on more than one GPU (FSDP2 ranks over NCCL) is not supported yet" in found


def test_gradients_and_buffers_stay_fp32(tmp_path):
    key = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.mixed_precision"
    found = problems(tmp_path, overrides=[f"{key}.reduce_dtype=bf16"])
    assert found == [f"{key}.reduce_dtype = bf16 is not supported yet (supported: fp32, float32)"]


def test_colocate_is_a_stage_of_both_roles(tmp_path):
    config = finalized(tmp_path, overrides=["mode=colocate"])
    assert config.mode == "colocate"
    assert config.synchronizer.sync_method == "memory"  # as in mode both: one process
    assert config.buffer.trainer_input.experience_buffer.storage_type == "queue"


def test_sequence_parallelism_runs_whole_sequences_and_says_so(tmp_path, caplog):
    overrides = [
        "trainer.ulysses_sequence_parallel_size=2",
        "trainer.trainer_config.actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ]
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        finalized(tmp_path, overrides=overrides)  # no problem: it runs
    warned = caplog.text
    assert "trainer.ulysses_sequence_parallel_size = 2: sequence parallelism" in warned
    assert "actor.ulysses_sequence_parallel_size = 2" in warned
    assert problems(tmp_path, overrides=["trainer.ulysses_sequence_parallel_size=0"])
