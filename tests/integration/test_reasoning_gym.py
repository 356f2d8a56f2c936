"""2 GRPO steps on reasoning-gym's own generators: a storage_type reasoning_gym taskset and a
held-out one from a later seed, run by reasoning_gym_workflow on the micro model.

Every stored experience must be asked as reasoning-gym asks (its system prompt, the question)
and rewarded with the dataset's own score of the reply's tagged answer.
"""

import pytest

from tests.integration.test_guess_number import stored_experiences
from tests.integration.test_run import records, weights_changed
from trinity.common.config.schema_buffer import ReasoningGymConfig
from trinity.common.reasoning_gym import generate_rows, score
from trinity.runtime.launcher import run

pytest.importorskip("reasoning_gym")

DATASET = {"basic_arithmetic": {"config": {"max_terms": 2, "max_digits": 1}}}

CONFIG = """
project: tests
name: reasoning_gym
checkpoint_root_dir: {root}
model: {{model_path: {model}, max_prompt_tokens: 240, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 4, optimizer: {{lr: 1e-3}}}}
buffer:
  batch_size: 4
  total_steps: 2
  explorer_input:
    default_workflow_type: reasoning_gym_workflow
    taskset:
      name: rg_train
      storage_type: reasoning_gym
      reasoning_gym: {{datasets: {datasets}, size: 16, seed: 42}}
      workflow_args: {{system_prompt: direct}}  # the shortest: the micro model has 256 positions
    eval_tasksets:
      - name: rg_test
        storage_type: reasoning_gym
        reasoning_gym: {{datasets: {datasets}, size: 4, seed: 1000}}
        workflow_args: {{system_prompt: direct}}
        rollout_args: {{temperature: 0.0}}
  trainer_input:
    experience_buffer: {{name: rg_buffer, storage_type: queue}}
explorer:
  runner_per_model: 2
  eval_interval: 2
  eval_on_startup: true
"""


def test_grpo_on_reasoning_gym_tasks_scored_by_the_dataset(tmp_path, micro_model, ray_cluster):
    from reasoning_gym.utils import SYSTEM_PROMPTS

    path = tmp_path / "rg.yaml"
    path.write_text(CONFIG.format(root=tmp_path, model=micro_model, datasets=DATASET))
    (result,) = run(str(path), [], [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)

    explorer = records(result.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/tasks_failed"] for r in steps] == [0, 0]
    assert [r["step"] for r in explorer if "eval/rg_test/accuracy/mean" in r] == [0, 2]

    spec = ReasoningGymConfig(datasets=DATASET, size=16, seed=42)
    rows = generate_rows(spec, "rg_train", "prompt", "response")
    experiences = stored_experiences(result.job_dir, "rg_buffer")
    assert len(experiences) == 2 * 4 * 4  # steps x tasks x replies
    for exp in experiences:
        assert SYSTEM_PROMPTS["direct"] in exp.prompt_text
        (row,) = [r for r in rows if exp.prompt_text.endswith(_asked(r["prompt"]))]
        assert exp.reward == score(exp.response_text, row["reasoning_gym"])
        assert exp.metrics["accuracy"] == exp.reward


def _asked(question: str) -> str:
    """The end of a prompt asking ``question`` (the micro model's ChatML template)."""
    return f"{question}<|im_end|>\n<|im_start|>assistant\n"
