"""trinity convert-verl: align-with-verl.md's two veRL scripts become its two Trinity configs."""

import os

import pytest
import yaml
from typer.testing import CliRunner

from trinity.cli.main import app
from trinity.common.config import load_config
from trinity.common.config.convert_verl import convert, parse_value, read_command, read_yaml

CONFIGS = os.path.join(os.path.dirname(__file__), "configs")


def flat(data, prefix=""):
    out = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        out.update(flat(value, path) if isinstance(value, dict) and value else {path: value})
    return out


def converted(name):
    with open(os.path.join(CONFIGS, name)) as f:
        return convert(read_command(f.read()))


def documented(name):
    """The document's config; YAML reads 1e-6 as a string, OmegaConf (and Trinity) a number."""
    with open(os.path.join(CONFIGS, name)) as f:
        leaves = flat(yaml.safe_load(f))
    return {k: parse_value(v) if isinstance(v, str) else v for k, v in leaves.items()}


# Where the converter knowingly differs from the document's hand-written configs:
# - tasksets name the parquet file itself (the document: its folder plus `split`);
# - `sync_offset: 0`, as the document's own note says matches veRL (its examples write 1);
# - `checkpoint_root_dir`, `sync_timeout` and `engine_num` have no veRL key (defaults apply);
# - the reward model's `engine_num`/`tensor_parallel_size` neither (its path is checked below);
# - `data.filter_overlong_prompts=True` drops over-long prompts, as veRL does (a task
#   pipeline's length_filter, checked below), where the document truncates them.
KNOWN = ("buffer.explorer_input", "synchronizer.sync_offset", "checkpoint_root_dir")
KNOWN += ("synchronizer.sync_timeout", "explorer.rollout_model.engine_num")
KNOWN += ("explorer.auxiliary_models", "model.enable_prompt_truncation")


@pytest.mark.parametrize(
    "script, example", [("verl_grpo.sh", "grpo_example.yaml"), ("verl_ppo.sh", "ppo_example.yaml")]
)
def test_each_documented_key_gets_the_documented_value(script, example):
    config, unmapped = converted(script)
    not_mapped = {line.split("=")[0] for line in unmapped}
    got, want = flat(config), documented(example)
    for key, value in want.items():
        if key.startswith(KNOWN):
            continue
        if key.removeprefix("trainer.trainer_config.") in not_mapped:
            # the document keeps it under trainer_config, where nothing reads it: listed instead
            assert key not in got
            continue
        assert got.get(key) == pytest.approx(value), key
    assert got["synchronizer.sync_offset"] == 0


def test_grpo_tasksets_batches_and_what_was_not_mapped():
    config, unmapped = converted("verl_grpo.sh")
    (train,) = config["buffer"]["explorer_input"]["tasksets"]
    assert train == {
        "name": "gsm8k",
        "storage_type": "file",
        "path": "${oc.env:HOME}/data/gsm8k/train.parquet",
    }
    # 256 tasks per step x n=8; data.train_batch_size 1024 / 256 = 4 steps between syncs
    assert config["buffer"]["batch_size"] == 256
    assert config["buffer"]["train_batch_size"] == 2048
    assert config["synchronizer"]["sync_interval"] == 4
    unused = "FSDP tuning of veRL; the native trainer shards and places weights itself"
    assert unmapped == [
        "actor_rollout_ref.model.use_remove_padding=true: the native trainer computes on "
        "padded batches",
        f"actor_rollout_ref.actor.fsdp_config.param_offload=false: {unused}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload=false: {unused}",
        f"actor_rollout_ref.ref.fsdp_config.param_offload=true: {unused}",
    ]
    # the rollout engine is the explorer's: rollout.name picks its engine
    assert config["explorer"]["rollout_model"]["engine_type"] == "vllm"
    assert "rollout" not in config["trainer"]["trainer_config"]["actor_rollout_ref"]
    # filter_overlong_prompts=True with max_prompt_length=512: prompts over 512 tokens, chat
    # template applied, are dropped before exploring; truncation=error then never applies
    assert config["data_processor"]["task_pipeline"]["operators"] == [
        {
            "name": "length_filter",
            "args": {"max_length": 512, "unit": "tokens", "chat_template": True},
        }
    ]
    assert "enable_prompt_truncation" not in config["model"]


@pytest.mark.parametrize(
    "args, model_keys, unmapped",
    [
        (["data.truncation=left"], {"enable_prompt_truncation": True}, []),
        (["data.truncation=error"], {}, ["data.truncation"]),
        (["data.truncation=right"], {}, ["data.truncation"]),
        (
            ["data.filter_overlong_prompts=False", "data.truncation=left"],
            {"enable_prompt_truncation": True},
            [],
        ),
    ],
)
def test_truncation_maps_only_where_it_means_the_same(args, model_keys, unmapped):
    config, skipped = convert(read_command(" ".join(["python3 -m verl.trainer.main_ppo", *args])))
    assert config.get("model", {}) == model_keys
    assert [line.split("=")[0] for line in skipped] == unmapped
    assert "data_processor" not in config


@pytest.mark.parametrize("name, engine", [("vllm", "vllm"), ("hf", "transformers")])
def test_the_rollout_name_picks_the_engine(name, engine):
    config, skipped = convert(read_command(f"x actor_rollout_ref.rollout.name={name}"))
    assert config["explorer"]["rollout_model"]["engine_type"] == engine and skipped == []


def test_an_engine_that_does_not_exist_here_is_listed():
    config, skipped = convert(read_command("x actor_rollout_ref.rollout.name=sglang"))
    assert "explorer" not in config
    assert skipped == [
        "actor_rollout_ref.rollout.name=sglang: no sglang engine here: vllm or hf (transformers)"
    ]


def test_ppo_script_variables_reward_model_and_unmapped_keys():
    config, unmapped = converted("verl_ppo.sh")
    sets = config["buffer"]["explorer_input"]
    # "$train_files" is a list assigned earlier in the script, its items $HOME-relative
    assert [s["path"] for s in sets["tasksets"]] == [
        "${oc.env:HOME}/data/gsm8k/train.parquet",
        "${oc.env:HOME}/data/math/train.parquet",
    ]
    assert [s["name"] for s in sets["eval_tasksets"]] == ["gsm8k_eval", "math_eval"]
    assert config["explorer"]["auxiliary_models"] == [
        {"model_path": "${oc.env:HOME}/models/FsfairX-LLaMA3-RM-v0.1"}
    ]
    assert [line.split("=")[0] for line in unmapped] == [
        "data.return_raw_chat",
        "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "critic.model.use_remove_padding",
        "critic.model.fsdp_config.param_offload",
        "critic.model.fsdp_config.optimizer_offload",
        "reward_model.model.use_remove_padding",
        "reward_model.model.fsdp_config.param_offload",
        "reward_model.micro_batch_size_per_gpu",
    ]


@pytest.mark.parametrize("script", ["verl_grpo.sh", "verl_ppo.sh"])
def test_the_written_yaml_loads_as_a_trinity_config(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")
    out = tmp_path / "converted.yaml"
    result = CliRunner().invoke(app, ["convert-verl", os.path.join(CONFIGS, script), "--out", out])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# converted from veRL")
    config = load_config(str(out))
    assert config.model.max_prompt_tokens in (512, 1024)
    assert config.buffer.explorer_input.tasksets[0].path.startswith("/home/user/data/")


def test_values_are_read_as_hydra_reads_them():
    assert parse_value("1e-6") == 1e-6
    assert parse_value("1024") == 1024 and isinstance(parse_value("1024"), int)
    assert parse_value("True") is True and parse_value("False") is False
    assert parse_value('["console","wandb"]') == ["console", "wandb"]
    assert parse_value("['a.parquet', 'b.parquet']") == ["a.parquet", "b.parquet"]
    assert parse_value("error") == "error"
    assert parse_value("null") is None


def test_a_verl_yaml_converts_like_its_command_line():
    text = """
algorithm: {adv_estimator: grpo, use_kl_in_reward: true, kl_penalty: kl}
actor_rollout_ref:
  actor: {ppo_mini_batch_size: 8, use_kl_loss: false, optim: {lr: 2.0e-6}}
  rollout: {n: 4, val_kwargs: {temperature: 0.0, n: 2}}
data: {train_files: /d/a/train.jsonl, val_files: /d/a/test.jsonl, train_batch_size: 16}
trainer: {logger: console, resume_mode: disable}
"""
    command = (
        "algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=True algorithm.kl_penalty=kl "
        "actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.use_kl_loss=False "
        "actor_rollout_ref.actor.optim.lr=2e-6 actor_rollout_ref.rollout.n=4 "
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.0 "
        "actor_rollout_ref.rollout.val_kwargs.n=2 data.train_files=/d/a/train.jsonl "
        "data.val_files=/d/a/test.jsonl data.train_batch_size=16 trainer.logger=console "
        "trainer.resume_mode=disable"
    )
    from_yaml, from_command = convert(read_yaml(text)), convert(read_command(command))
    assert from_yaml == from_command
    config, unmapped = from_yaml
    assert unmapped == []
    assert config["algorithm"]["kl_penalty_fn"] == "k1"  # veRL's "kl" estimator
    assert config["algorithm"]["kl_loss_fn"] == "none"
    assert config["continue_from_checkpoint"] is False
    assert "monitor" not in config  # console only: the default monitor stays
    (evals,) = config["buffer"]["explorer_input"]["eval_tasksets"]
    assert evals["repeat_times"] == 2 and evals["rollout_args"] == {"temperature": 0.0}
    assert config["buffer"]["train_batch_size"] == 32
    assert config["synchronizer"]["sync_interval"] == 2


def test_unknown_keys_are_listed_not_dropped():
    _, unmapped = convert(read_command("algorithm.adv_estimator=magic foo.bar=1"))
    assert unmapped == [
        "algorithm.adv_estimator=magic: no Trinity advantage function of that name",
        "foo.bar=1: no Trinity key holds it",
    ]


def test_rollout_correction_keys_keep_their_names():
    command = (
        "algorithm.adv_estimator=grpo algorithm.rollout_correction.rollout_is=sequence "
        "algorithm.rollout_correction.rollout_is_threshold=2.0 "
        "algorithm.rollout_correction.rollout_rs=geometric "
        "algorithm.rollout_correction.rollout_rs_threshold=1.001 "
        "algorithm.rollout_correction.rollout_rs_threshold_lower=0.999 "
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"
    )
    config, unmapped = convert(read_command(command))
    assert unmapped == []
    assert config["algorithm"]["rollout_correction"] == {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "geometric",
        "rollout_rs_threshold": 1.001,
        "rollout_rs_threshold_lower": 0.999,
        "rollout_token_veto_threshold": 1e-4,
    }
