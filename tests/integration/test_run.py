"""Whole `trinity run` stages on the micro model, in-process, against one local Ray."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.integration.conftest import HERE, base_overrides
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def records(job_dir: str, role: str) -> list:
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights_changed(before: str, after: str) -> bool:
    a = AutoModelForCausalLM.from_pretrained(before).state_dict()
    b = AutoModelForCausalLM.from_pretrained(after).state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_grpo_both_mode(tmp_path, micro_model, arithmetic_data, ray_cluster):
    (result,) = run(CONFIG, base_overrides(tmp_path, micro_model, arithmetic_data), [])
    job_dir = result.job_dir
    assert job_dir == os.path.join(tmp_path, "tests", "grpo_small")
    assert os.path.isfile(os.path.join(job_dir, "config.yaml"))

    trainer = records(job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/rewards/mean"):
        assert all(key in r and r[key] == r[key] for r in trainer), key  # present and not NaN
    assert all("response_length/mean" in r for r in trainer)

    explorer = records(job_dir, "explorer")
    eval_steps = [r["step"] for r in explorer if "eval/arith_test/accuracy/mean" in r]
    assert eval_steps == [0, 2, 3]  # startup, eval_interval, and after the last step
    assert [r["rollout/model_version"] for r in explorer if "rollout/model_version" in r] == [
        0,
        1,
        2,
    ]

    assert result.final_hf == os.path.join(job_dir, "global_step_3", "hf")
    assert weights_changed(micro_model, result.final_hf)
    assert os.listdir(os.path.join(job_dir, "monitor", "tensorboard", "grpo_small_trainer"))
    assert os.path.getsize(os.path.join(job_dir, "monitor", "plots.png")) > 0  # end-of-run plot


def test_guide_example_workflow_as_plugin(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys
):
    """The developer guide's ExampleWorkflow, pasted into a plugin file, trains for real;
    its runners report their state on the console (runner_state_report_interval)."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_workflow_type=example_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
        # A line every 10 ms: with 0.2 s, a run whose tasks take a few ms each (the engine
        # gathers requests for 2 ms since 3095fcd) could end before a runner's first line.
        "explorer.runner_state_report_interval=0.01",
    ]
    (result,) = run(CONFIG, overrides, [os.path.join(HERE, "plugins")])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)
    out = capsys.readouterr().out
    assert "explorer_runner_0" in out
    assert " finished, 0 failed so far" in out, out


def staged_config(tmp_path, arithmetic_data) -> str:
    """grpo_small.yaml behind a 2-step train-only sft stage, as the quickstart stages it."""
    with open(CONFIG) as f:
        text = f.read()
    config = tmp_path / "stages.yaml"
    config.write_text(
        text
        + f"""
stages:
  - stage_name: sft
    mode: train
    algorithm: {{algorithm_type: sft}}
    buffer:
      train_batch_size: 16
      total_steps: 2
      trainer_input:
        experience_buffer:
          name: sft_data
          storage_type: file
          path: {arithmetic_data["sft"]}
          format: {{prompt_key: prompt, response_key: response}}
  - stage_name: rl
"""
    )
    return str(config)


def test_sft_stage_then_grpo_stage(tmp_path, micro_model, arithmetic_data, ray_cluster):
    config = staged_config(tmp_path, arithmetic_data)
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data)
    sft, rl = run(config, overrides, [])
    assert sft.name == "grpo_small_sft" and rl.name == "grpo_small_rl"
    assert [r["step"] for r in records(sft.job_dir, "trainer")] == [1, 2]
    assert "actor/sft_loss" in records(sft.job_dir, "trainer")[0]
    # The RL stage starts from the SFT stage's final weights.
    with open(os.path.join(rl.job_dir, "config.yaml")) as f:
        assert sft.final_hf in f.read()
    assert weights_changed(sft.final_hf, rl.final_hf)


def test_failing_workflow_stops_the_run_with_its_error(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    from trinity.runtime.launcher import RunFailed

    # A reward that raises at run time (an unknown reward name now fails before Ray starts).
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_reward_fn_type=failing_reward",
        "explorer.max_retry_times=0",
    ]
    with pytest.raises(RunFailed, match="failing_reward"):
        run(CONFIG, overrides, [os.path.join(HERE, "plugins")])


def test_checkpoint_sync_method(tmp_path, micro_model, arithmetic_data, ray_cluster):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "synchronizer.sync_method=checkpoint",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
    ]
    (result,) = run(CONFIG, overrides, [])
    explorer = records(result.job_dir, "explorer")
    # step 2 explored with the weights the trainer wrote to disk after step 1
    assert [r["rollout/model_version"] for r in explorer] == [0, 1]


def test_explore_mode_writes_the_experience_buffer(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    from trinity.buffer import SQLExperienceStore

    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "mode=explore",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
        "buffer.trainer_input.experience_buffer={name: eb, storage_type: queue,"
        f" path: 'sqlite:///{tmp_path}/backup.db'}}",
    ]
    (result,) = run(CONFIG, overrides, [])
    assert result.final_hf is None
    store = SQLExperienceStore(os.path.join(tmp_path, "backup.db"), "eb")  # path, name asked
    stored = store.unconsumed()
    assert len(stored) == 2 * 4 * 4  # steps x batch_size x repeat_times, none consumed
    assert all(exp.group_id and exp.logprobs is not None for _, _, exp in stored)
    assert sorted(store.finished_steps()) == [1, 2]
    assert [step for _, step, _ in stored] == [1] * 16 + [2] * 16
