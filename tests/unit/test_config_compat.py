"""Configs written for the original (DESIGN decision 20), through load_config and finalize:
veRL loss keys reach the algorithm's components, a command-line override wins over the
file's key of the same setting, what is not built is refused by name, and the token budget
follows model.max_model_len as the original's did."""

import logging
import textwrap

import pytest
import torch
import yaml

from trinity.algorithm import POLICY_LOSS_FN
from trinity.common.config import ConfigError, load_config
from trinity.preflight.derive import finalize

BASE = """
model: {model_path: /m, max_prompt_tokens: 16, max_response_tokens: 16}
cluster: {gpu_per_node: 0}
algorithm: {algorithm_type: grpo, repeat_times: 2}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {name: t, path: /data}
"""
ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"


def merged(base, extra):
    """``extra``'s sections merged key by key over ``base``'s (YAML allows a key once)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged(base[key], value)
        else:
            base[key] = value
    return base


def load(tmp_path, extra="", overrides=(), base=BASE):
    path = tmp_path / "config.yaml"
    data = merged(yaml.safe_load(base), yaml.safe_load(textwrap.dedent(extra)) or {})
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path), list(overrides))


def finalized(tmp_path, extra="", overrides=()):
    return finalize(load(tmp_path, extra, overrides))


def problems(tmp_path, extra="", overrides=()):
    with pytest.raises(ConfigError) as info:
        finalized(tmp_path, extra, overrides)
    return info.value.problems


def notes(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "trinity.config"]


def verl_actor(**keys):
    inner = ", ".join(f"{k}: {v}" for k, v in keys.items())
    return f"trainer: {{trainer_config: {{actor_rollout_ref: {{actor: {{{inner}}}}}}}}}\n"


# ---- veRL loss keys --------------------------------------------------------------------


def test_clip_ratio_high_reaches_the_policy_loss_as_clip_range_high(tmp_path):
    config = finalized(tmp_path, verl_actor(clip_ratio_low=0.2, clip_ratio_high=0.28))
    algo = config.algorithm
    assert algo.policy_loss_fn == "ppo"
    # built as the trainer builds it (trinity/trainer/trainer.py)
    loss_fn = POLICY_LOSS_FN.get(algo.policy_loss_fn)(**algo.policy_loss_fn_args)
    assert (loss_fn.clip_range_low, loss_fn.clip_range_high) == (0.2, 0.28)
    # ratio 1.25 on a positive advantage: inside 1 + 0.28, so the loss is -A * 1.25;
    # the default symmetric 0.2 would have clipped it to -A * 1.2
    logprob = torch.tensor([[torch.log(torch.tensor(1.25)).item()]])
    loss, _ = loss_fn(logprob, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.25)
    default = POLICY_LOSS_FN.get("ppo")()
    assert default(logprob, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))[
        0
    ].item() == pytest.approx(-1.2)


def test_verl_loss_keys_reach_their_components(tmp_path):
    keys = dict(clip_ratio=0.3, clip_ratio_c=3.0, entropy_coeff=0.01, kl_loss_coef=0.05)
    keys.update(use_kl_loss="true", kl_loss_type="mse", loss_agg_mode="seq-mean-token-mean")
    algo = finalized(tmp_path, verl_actor(**keys)).algorithm
    assert algo.policy_loss_fn_args["clip_range"] == 0.3
    assert algo.policy_loss_fn_args["clip_ratio_c"] == 3.0
    assert algo.entropy_loss_fn_args["entropy_coef"] == 0.01
    assert (algo.kl_loss_fn, algo.kl_loss_fn_args["kl_coef"]) == ("k2", 0.05)  # veRL's mse
    assert algo.loss_agg_mode == "seq-mean-token-mean"
    assert algo.policy_loss_fn_args["loss_agg_mode"] == "seq-mean-token-mean"


def test_use_kl_loss_false_turns_the_kl_loss_off(tmp_path):
    assert finalized(tmp_path, verl_actor(use_kl_loss="false")).algorithm.kl_loss_fn == "none"


def test_a_verl_key_and_the_algorithm_key_set_differently_are_refused_naming_both(tmp_path):
    extra = verl_actor(clip_ratio_high=0.28)
    extra += "algorithm: {policy_loss_fn_args: {clip_range_high: 0.3}}\n"
    found = problems(tmp_path, extra)
    assert found == [
        f"{ACTOR}.clip_ratio_high = 0.28 conflicts with "
        "algorithm.policy_loss_fn_args.clip_range_high = 0.3; set only "
        "algorithm.policy_loss_fn_args.clip_range_high"
    ]
    found = problems(tmp_path, verl_actor(use_kl_loss="false") + "algorithm: {kl_loss_fn: k3}\n")
    assert found == [
        f"{ACTOR}.use_kl_loss = false means algorithm.kl_loss_fn = none, but "
        "algorithm.kl_loss_fn = k3; set only algorithm.kl_loss_fn"
    ]


def test_a_verl_key_no_component_takes_is_dropped_with_a_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, verl_actor(tau=0.5))
    assert "tau" not in config.algorithm.policy_loss_fn_args
    assert (
        f"{ACTOR}.tau = 0.5 is not read: algorithm grpo's policy_loss_fn ppo takes no tau, its "
        "advantage_fn grpo takes no tau" in notes(caplog)
    )


def test_dpo_read_kl_loss_coef_as_its_beta_in_0_1(tmp_path):
    extra = verl_actor(kl_loss_coef=0.2)
    extra += "algorithm: {algorithm_type: dpo}\nmode: train\n"
    extra += "buffer: {trainer_input: {experience_buffer: {name: d, path: /dpo}}}\n"
    config = finalize(load(tmp_path, extra))
    assert config.algorithm.policy_loss_fn_args["beta"] == 0.2


def test_verl_gae_keys_and_the_0_1_kl_penalty_rule(tmp_path):
    """0.1.1 (and veRL then) subtracted the KL penalty from rewards unless the actor had a
    KL loss; gamma and lam are the GAE advantage's."""
    extra = verl_actor(use_kl_loss="false")
    extra = extra.replace(
        "trainer_config: {",
        "trainer_config: {algorithm: {gamma: 0.9, lam: 0.8, kl_penalty: kl, "
        "kl_ctrl: {type: fixed, kl_coef: 0.002}}, ",
    )
    extra += "algorithm: {algorithm_type: ppo}\n"
    algo = finalized(tmp_path, extra).algorithm
    assert (algo.advantage_fn_args["gamma"], algo.advantage_fn_args["lam"]) == (0.9, 0.8)
    assert algo.kl_penalty_fn == "k1"
    assert algo.kl_penalty_fn_args["kl_ctrl"] == {"type": "fixed", "kl_coef": 0.002}


def test_the_original_mix_loss_batch_size_arguments_are_dropped_with_one_line(tmp_path, caplog):
    extra = """
    algorithm:
      algorithm_type: mix
      repeat_times: 2
      policy_loss_fn_args: {mu: 0.2, ngpus_trainer: 8, train_batch_size_expert: 64}
    buffer: {trainer_input: {auxiliary_buffers: {sft_dataset: {name: s, path: /sft}}}}
    """
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, extra)
    args = config.algorithm.policy_loss_fn_args
    assert args["mu"] == 0.2 and "ngpus_trainer" not in args
    assert "train_batch_size_expert" not in args
    [line] = [n for n in notes(caplog) if "ngpus_trainer" in n]
    assert line.startswith(
        "algorithm.policy_loss_fn_args.ngpus_trainer = 8, "
        "algorithm.policy_loss_fn_args.train_batch_size_expert = 64 (Trinity-RFT 0.5.2 and "
        "earlier: batch sizes the original's mix loss weighted"
    )


@pytest.mark.parametrize(
    "token_level, mode", [(True, "token-mean"), (False, "seq-mean-token-mean")]
)
@pytest.mark.parametrize("loss", ["mix", "mix_chord"])
def test_the_original_sft_token_level_switch_is_read_as_its_aggregation(
    tmp_path, caplog, loss, token_level, mode
):
    """0.2.0's mix loss took use_token_level_loss_in_sft: the SFT term's mean over every token
    of the batch (true), or each sequence's mean and then their mean (false)."""
    extra = f"""
    algorithm:
      algorithm_type: mix
      policy_loss_fn: {loss}
      repeat_times: 2
      policy_loss_fn_args: {{use_token_level_loss_in_sft: {str(token_level).lower()}}}
    buffer: {{trainer_input: {{auxiliary_buffers: {{sft_dataset: {{name: s, path: /sft}}}}}}}}
    """
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, extra)
    args = config.algorithm.policy_loss_fn_args
    assert args["sft_loss_agg_mode"] == mode and "use_token_level_loss_in_sft" not in args
    assert (
        f"algorithm.policy_loss_fn_args.use_token_level_loss_in_sft = {token_level} "
        f"(Trinity-RFT 0.3.0 and earlier) is read as "
        f"algorithm.policy_loss_fn_args.sft_loss_agg_mode = {mode}"
    ) in notes(caplog)


# ---- the command line wins over the file's key of the same setting -----------------------


@pytest.mark.parametrize(
    "file_key, command_line",
    [("trainer.total_steps", "buffer.total_steps"), ("buffer.total_steps", "trainer.total_steps")],
)
def test_a_command_line_override_beats_the_files_other_key(
    tmp_path, caplog, file_key, command_line
):
    section, key = file_key.split(".")
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, f"{section}: {{{key}: 200}}\n", [f"{command_line}=1"])
    assert config.buffer.total_steps == 1 and config.trainer.total_steps == 1
    assert notes(caplog)[0] == (
        f"{command_line}=1 (command line) is used, not {file_key}: 200 from the file: the two "
        "keys set one setting"
    )


def test_both_keys_in_the_file_still_disagree(tmp_path):
    found = problems(tmp_path, "trainer: {total_steps: 200}\nbuffer: {total_steps: 1}\n")
    assert found == [
        "buffer.total_steps = 1 and trainer.total_steps = 200 disagree; set one of them"
    ]


def test_a_global_override_beats_the_other_key_a_stage_sets(tmp_path, caplog):
    extra = "stages:\n  - {stage_name: a, trainer: {total_steps: 200}}\n"
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        root = load(tmp_path, extra, ["buffer.total_steps=1"])
    (stage,) = root.stage_configs()
    assert finalize(stage).trainer.total_steps == 1
    assert (
        "stages.0.buffer.total_steps=1 (command line) is used, not stages.0.trainer.total_steps: "
        "200 from the file: the two keys set one setting"
    ) in notes(caplog)


def test_the_current_name_on_the_command_line_beats_an_earlier_one_in_the_file(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = load(tmp_path, "explorer: {runner_num: 32}\n", ["explorer.runner_per_model=2"])
    assert config.explorer.runner_per_model == 2
    assert notes(caplog) == [
        "explorer.runner_per_model=2 (command line) is used, not explorer.runner_num: 32 from "
        "the file: the two keys set one setting"
    ]


def test_a_verl_key_on_the_command_line_beats_the_algorithm_key_in_the_file(tmp_path, caplog):
    extra = "algorithm: {policy_loss_fn_args: {clip_range_high: 0.3}}\n"
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, extra, [f"{ACTOR}.clip_ratio_high=0.28"])
    assert config.algorithm.policy_loss_fn_args["clip_range_high"] == 0.28


def test_the_single_taskset_spelling_reaches_a_file_that_writes_a_list(tmp_path):
    extra = "buffer: {explorer_input: {tasksets: [{name: t, path: /data}]}}\n"
    base = BASE.replace("    taskset: {name: t, path: /data}\n", "")
    config = load(tmp_path, extra, ["buffer.explorer_input.taskset.path=/other"], base=base)
    assert [t.path for t in config.buffer.explorer_input.tasksets] == ["/other"]


# ---- not supported yet, by name ----------------------------------------------------------


@pytest.mark.parametrize(
    "extra, start",
    [
        (
            "buffer: {explorer_input: {taskset: {name: t, format: {image_key: images}}}}\n",
            "buffer.explorer_input.tasksets[0].format.image_key = images is not supported yet: "
            "multimodal tasks",
        ),
        (
            "buffer: {explorer_input: {taskset: {name: t, path: /d, format: {video_key: v}}}}\n",
            "buffer.explorer_input.tasksets[0].format.video_key = v is not supported yet: "
            "multimodal tasks",
        ),
        (
            verl_actor(megatron="{tensor_model_parallel_size: 2}"),
            f"{ACTOR}.megatron = {{...}} is not supported yet: the Megatron backend is not built",
        ),
        (
            verl_actor(strategy="megatron"),
            f"{ACTOR}.strategy = megatron is not supported yet: the Megatron backend",
        ),
        (
            "trainer: {trainer_strategy: megatron}\n",
            "trainer.trainer_strategy = megatron is not supported yet: the Megatron backend",
        ),
        (
            "mode: explore\nmodel: {tinker: {enable: true}}\n",
            "model.tinker.enable = true is not supported yet: a Tinker run is mode both",
        ),
        (
            "algorithm: {algorithm_type: raft}\n",
            "algorithm.algorithm_type = raft is not supported yet",
        ),
    ],
)
def test_what_is_not_built_is_named_not_supported_yet(tmp_path, extra, start):
    found = problems(tmp_path, extra)
    assert [p for p in found if p.startswith(start)], found
    assert not [p for p in found if "unknown" in p], found


# ---- token budgets and sync keys -----------------------------------------------------------


def test_a_token_budget_below_max_model_len_is_raised_to_it(tmp_path, caplog):
    extra = "trainer: {max_token_len_per_gpu: 20}\n"
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, extra)
    assert config.trainer.max_token_len_per_gpu == 32  # max_prompt + max_response tokens
    assert (
        "trainer.max_token_len_per_gpu = 20 is less than model.max_model_len = 32: raised to 32 "
        "so that a micro-batch holds one whole sequence (lower model.max_model_len to use less "
        "memory)"
    ) in notes(caplog)


def test_a_taskset_n_other_than_its_repeat_times_is_not_read(tmp_path, caplog):
    """The original overwrote rollout_args.n with the repeat times (0.1.1 configs set both)."""
    extra = "buffer: {explorer_input: {taskset: {name: t, rollout_args: {n: 8, logprobs: 0}}}}\n"
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config = finalized(tmp_path, extra)
    assert config.buffer.explorer_input.tasksets[0].rollout_args.n == 2
    assert (
        "buffer.explorer_input.tasksets[0].rollout_args.n = 8 is not read: the taskset's "
        "repeat_times (2) is its samples per task"
    ) in notes(caplog)


def test_sync_keys_of_a_train_stage_are_ignored_with_one_line(tmp_path, caplog):
    extra = """
    synchronizer: {sync_method: nccl, sync_style: dynamic_by_explorer}
    stages:
      - stage_name: sft
        mode: train
        algorithm: {algorithm_type: sft}
        synchronizer: {sync_method: memory}
        buffer: {trainer_input: {experience_buffer: {name: s, path: /sft}}}
    """
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        (stage,) = load(tmp_path, extra).stage_configs()
        config = finalize(stage)
    assert config.synchronizer.sync_method == "checkpoint"
    assert "synchronizer.sync_method = memory: ignored in mode train" in "\n".join(notes(caplog))
