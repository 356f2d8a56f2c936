"""The OpenAI-compatible API in a real run: each rollout engine actor serves it, and a plugin
workflow that talks only to ``get_openai_client()`` trains through ``enable_history``; with
an API key set, the servers require it and the workflow's clients send it."""

import glob
import os

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from trinity.runtime.launcher import run


def test_grpo_through_the_openai_client_with_history(
    tmp_path, micro_model, arithmetic_data, ray_cluster, monkeypatch
):
    monkeypatch.setenv("TRINITY_API_KEY", "workflow-key")  # every server of the run requires it
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "explorer.rollout_model.enable_openai_api=true",
        "explorer.rollout_model.enable_history=true",
        "explorer.rollout_model.engine_num=2",
        "buffer.explorer_input.taskset.default_workflow_type=openai_example_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
    ]
    (result,) = run(CONFIG, overrides, [os.path.join(HERE, "plugins_openai")])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    assert weights_changed(micro_model, result.final_hf)
    explorer = [r for r in records(result.job_dir, "explorer") if "rollout/tasks_failed" in r]
    assert [r["rollout/tasks_failed"] for r in explorer] == [0, 0]
    # Each engine served on loopback, on a port of its own, requiring the key: the workflow's
    # clients sent it (no task failed), and no log shows it.
    served = []
    for log in glob.glob(os.path.join(result.job_dir, "log", "*.log")):
        with open(log, encoding="utf-8") as f:
            text = f.read()
        assert "workflow-key" not in text
        served += [
            line.split(" at ")[-1] for line in text.splitlines() if "OpenAI-compatible" in line
        ]
    assert len(served) == 2 and len(set(served)) == 2
    assert all(url.startswith("http://127.0.0.1:") for url in served)
    assert all(url.endswith("/v1 (API key required)") for url in served)
