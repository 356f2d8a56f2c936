"""``explorer.concurrent_mode: asynchronous``: a GRPO run whose workflow is a coroutine."""

import os

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from trinity.runtime.launcher import run


def test_grpo_with_an_async_plugin_workflow(tmp_path, micro_model, arithmetic_data, ray_cluster):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "explorer.concurrent_mode=asynchronous",
        "buffer.explorer_input.taskset.default_workflow_type=async_two_turns",
        "model.max_prompt_tokens=120",  # room for the second turn's conversation
        "buffer.total_steps=2",
    ]
    (result,) = run(CONFIG, overrides, [os.path.join(HERE, "plugins_async")])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)

    explorer = records(result.job_dir, "explorer")
    steps = [r for r in explorer if "rollout/model_version" in r]
    assert [r["rollout/model_version"] for r in steps] == [0, 1]
    assert all(r["rollout/tasks_failed"] == 0 for r in steps)
    # 8 tasks over 2 runners: a runner's later tasks ran on the loop of its earlier ones
    assert max(r["rollout/tasks_on_loop/max"] for r in steps) >= 2
    # the eval taskset's math_workflow only has a blocking run(): it ran in worker threads
    evals = [r for r in explorer if "eval/arith_test/accuracy/mean" in r]
    assert [r["step"] for r in evals] == [0, 2]
