"""The GRPO example of spec/align-with-verl.md runs, scaled down to the micro model."""

import glob
import json
import os

import pytest

from tests.integration.conftest import HERE
from trinity.runtime.launcher import run

EXAMPLES = os.path.join(os.path.dirname(HERE), "unit", "configs")
EXAMPLE = os.path.join(EXAMPLES, "grpo_example.yaml")


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path, monkeypatch):
    """The examples log to wandb (monitor_type: wandb): offline, in the job folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))


def test_verl_grpo_example_runs_a_few_steps(
    tmp_path, micro_model, arithmetic_data, ray_cluster, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path))  # the example reads ${oc.env:HOME}/data/gsm8k
    data = arithmetic_data["rl"]
    overrides = [
        # model, data and cluster values swapped for the tiny ones; nothing else
        f"checkpoint_root_dir={tmp_path}/ck",
        f"model.model_path={micro_model}",
        "model.max_prompt_tokens=40",
        "model.max_response_tokens=4",
        f"buffer.explorer_input.tasksets.0.path={data}",
        "buffer.explorer_input.tasksets.0.format.prompt_key=question",
        f"buffer.explorer_input.eval_tasksets.0.path={data}",
        "buffer.explorer_input.eval_tasksets.0.format.prompt_key=question",
        "buffer.batch_size=2",
        "buffer.train_batch_size=16",
        "buffer.total_steps=2",
        "cluster.gpu_per_node=0",
    ]
    (result,) = run(EXAMPLE, overrides, [])
    runs = glob.glob(os.path.join(result.job_dir, "monitor", "wandb", "offline-run-*"))
    assert len(runs) == 2  # the explorer's and the trainer's
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2]
    # kl_loss_fn: low_var_kl with kl_coef 0.001 from the example's kl_loss_fn_args
    assert all(r["actor/kl_coef"] == 0.001 for r in trainer)
    with open(os.path.join(result.job_dir, "config.yaml")) as f:
        resolved = f.read()
    assert "use_dynamic_bsz: true" in resolved and "max_token_len_per_gpu: 24000" in resolved


def test_verl_ppo_example_runs_a_few_steps(
    tmp_path, micro_model, arithmetic_data, ray_cluster, monkeypatch
):
    """The PPO example: critic from critic_model_path with the trainer_config critic keys; its
    reward model (explorer.auxiliary_models) is replaced by a rule reward, as none can be
    downloaded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    data = arithmetic_data["rl"]
    overrides = [
        f"checkpoint_root_dir={tmp_path}/ck",
        f"model.model_path={micro_model}",
        f"model.critic_model_path={micro_model}",
        "model.max_prompt_tokens=40",
        "model.max_response_tokens=4",
        "explorer.auxiliary_models=[]",
        "buffer.explorer_input.default_reward_fn_type=math_reward",
        *[
            f"buffer.explorer_input.{sets}.{i}.{key}"
            for sets in ("tasksets", "eval_tasksets")
            for i in (0, 1)
            for key in (f"path={data}", "format.prompt_key=question")
        ],
        "buffer.batch_size=4",
        "buffer.train_batch_size=4",
        "buffer.total_steps=2",
        "cluster.gpu_per_node=0",
    ]
    (result,) = run(os.path.join(EXAMPLES, "ppo_example.yaml"), overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2]
    # critic.optim.lr: 1e-5 and lr_warmup_steps_ratio: 0.05 from trainer_config.critic
    assert all("critic/vf_loss" in r and "critic/lr" in r for r in trainer)
    assert os.path.exists(os.path.join(result.job_dir, "global_step_2", "critic.pt"))


def _converted(tmp_path, script: str) -> str:
    """``trinity convert-verl`` of one of align-with-verl.md's veRL scripts."""
    from typer.testing import CliRunner

    from trinity.cli.main import app

    out = os.path.join(tmp_path, script.replace(".sh", ".yaml"))
    result = CliRunner().invoke(app, ["convert-verl", os.path.join(EXAMPLES, script), "--out", out])
    assert result.exit_code == 0, result.output
    return out


def _tiny(tmp_path, micro_model, data, tasksets: int) -> list:
    """The converted config pointed at the micro model and local data, two small steps."""
    return [
        f"checkpoint_root_dir={tmp_path}/ck",
        f"model.model_path={micro_model}",
        "model.max_prompt_tokens=40",
        "model.max_response_tokens=4",
        *[
            f"buffer.explorer_input.{sets}.{i}.{key}"
            for sets in ("tasksets", "eval_tasksets")
            for i in range(tasksets)
            for key in (f"path={data}", "format.prompt_key=question", "format.response_key=answer")
        ],
        "buffer.total_steps=2",
        "synchronizer.sync_interval=1",
        "cluster.gpu_per_node=0",
        # rollout.name=vllm converts to the vllm engine (unit-tested); the micro model's two
        # steps run on the built-in one
        "explorer.rollout_model.engine_type=transformers",
    ]


def test_converted_verl_grpo_script_runs_two_steps(
    tmp_path, micro_model, arithmetic_data, ray_cluster, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = _converted(tmp_path, "verl_grpo.sh")
    overrides = _tiny(tmp_path, micro_model, arithmetic_data["rl"], 1)
    overrides += ["buffer.batch_size=2", "buffer.train_batch_size=16"]
    (result,) = run(config, overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2]
    assert all(r["actor/kl_coef"] == 0.001 for r in trainer)  # actor.kl_loss_coef=0.001


def test_converted_verl_ppo_script_runs_two_steps(
    tmp_path, micro_model, arithmetic_data, ray_cluster, monkeypatch
):
    """The reward model (explorer.auxiliary_models) is swapped for a rule reward, as in the
    hand-written example's test: none can be downloaded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = _converted(tmp_path, "verl_ppo.sh")
    overrides = _tiny(tmp_path, micro_model, arithmetic_data["rl"], 2) + [
        f"model.critic_model_path={micro_model}",
        "explorer.auxiliary_models=[]",
        "buffer.explorer_input.default_reward_fn_type=math_reward",
        "buffer.batch_size=4",
        "buffer.train_batch_size=4",
    ]
    (result,) = run(config, overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2]
    assert all("critic/vf_loss" in r for r in trainer)  # critic.optim.lr etc. carried over
