"""The original Trinity-RFT's workflows train here: GRPO steps on the micro model with the
workflow and reward settings of the original's examples (dapo_math: math_boxed_workflow on a
base-model prompt with math_dapo_reward's overlong penalty and math_eval_workflow evaluating;
grpo_toolcall: toolcall_workflow on ToolACE rows; opd_gsm8k: on_policy_distill_math_workflow
with a teacher)."""

import json
import os

from tests.integration.conftest import base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from trinity.runtime.launcher import run


def test_math_boxed_workflow_with_dapo_reward_trains(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    taskset = "buffer.explorer_input.taskset"
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_workflow_type=math_boxed_workflow",
        "buffer.explorer_input.default_eval_workflow_type=math_eval_workflow",
        "buffer.explorer_input.default_reward_fn_type=math_dapo_reward",
        f"{taskset}.workflow_args={{use_base: true}}",
        # The micro model writes at most 4 tokens: past 2 of them the penalty starts.
        f"{taskset}.reward_fn_args={{enable_overlong_penalty: true, penalty_factor: 1.0, "
        "max_response_length: 4, cache_length: 2}",
        "model.max_prompt_tokens=160",
        "buffer.total_steps=1",
        "explorer.eval_interval=1",
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1]
    assert weights_changed(micro_model, result.final_hf)
    explorer = records(result.job_dir, "explorer")
    rollout = [r for r in explorer if "rollout/format_score/mean" in r]
    # Every response of the micro model is 2..4 tokens: penalties 0..-1, and never +.
    assert rollout and all(-1.0 <= r["rollout/format_score/mean"] <= 0.0 for r in rollout)
    assert any("eval/arith_test/accuracy/mean" in r for r in explorer)


def _toolace_rows(path: str, n: int) -> None:
    os.makedirs(path, exist_ok=True)
    tools = json.dumps([{"name": "add", "parameters": {"a": "int", "b": "int"}}])
    with open(os.path.join(path, "train.jsonl"), "w") as f:
        for i in range(n):
            call = [{"name": "add", "arguments": {"a": i, "b": 1}}]
            row = {
                "tools": tools,
                "raw_system": "Use tools.",
                "conversations": [{"from": "human", "value": f"{i}+1?"}],
                "answer": json.dumps(call),
            }
            f.write(json.dumps(row) + "\n")


TOOLACE_CONFIG = """
# The original's examples/grpo_toolcall/toolace.yaml, scaled to the micro model.
project: tests
name: toolace
checkpoint_root_dir: {root}
algorithm: {{algorithm_type: grpo, repeat_times: 4, optimizer: {{lr: 1e-3}}}}
model: {{model_path: {model}, max_prompt_tokens: 240, max_response_tokens: 4}}
buffer:
  total_steps: 1
  batch_size: 4
  explorer_input:
    taskset:
      name: toolace_data
      storage_type: file
      path: {data}
      # format: []
      rollout_args: {{temperature: 1.0, logprobs: 0}}
      default_workflow_type: 'toolcall_workflow'
  trainer_input:
    experience_buffer: {{name: toolace_buffer, storage_type: queue}}
explorer:
  runner_per_model: 2
"""


def test_toolcall_workflow_trains(tmp_path, micro_model, ray_cluster):
    data = str(tmp_path / "toolace")
    _toolace_rows(data, 8)
    config = tmp_path / "toolace.yaml"
    config.write_text(TOOLACE_CONFIG.format(root=tmp_path, model=micro_model, data=data))
    (result,) = run(str(config), [], [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1]
    explorer = records(result.job_dir, "explorer")
    # A random micro model never writes a right call.
    assert any(r.get("rollout/accuracy/mean") == 0.0 for r in explorer)


def test_on_policy_distill_math_workflow_trains(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """The original's opd_gsm8k shape: on_policy_distill from a teacher auxiliary model."""
    from trinity.demo.tiny import build_tiny_preset

    teacher = build_tiny_preset(str(tmp_path / "teacher"), "micro", seed=1)
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "algorithm.algorithm_type=on_policy_distill",
        "buffer.explorer_input.default_workflow_type=on_policy_distill_math_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        f"explorer.auxiliary_models=[{{model_path: {teacher}}}]",
        "model.max_prompt_tokens=160",
        "buffer.total_steps=1",
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1]
    assert trainer[0]["distill/reverse_kl"] > 0  # the teacher scored the student's answers
    assert weights_changed(micro_model, result.final_hf)
