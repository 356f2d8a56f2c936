"""The GRPO example of spec/align-with-verl.md runs, scaled down to the micro model."""

import json
import os

from tests.integration.conftest import HERE
from trinity.runtime.launcher import run

EXAMPLE = os.path.join(os.path.dirname(HERE), "unit", "configs", "grpo_example.yaml")


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
        "monitor.monitor_type=tensorboard",  # wandb is an optional extra, not installed here
    ]
    (result,) = run(EXAMPLE, overrides, [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2]
    # kl_loss_fn: low_var_kl with kl_coef 0.001 from the example's kl_loss_fn_args
    assert all(r["actor/kl_coef"] == 0.001 for r in trainer)
    with open(os.path.join(result.job_dir, "config.yaml")) as f:
        resolved = f.read()
    assert "use_dynamic_bsz: true" in resolved and "max_token_len_per_gpu: 24000" in resolved
