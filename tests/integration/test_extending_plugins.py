"""docs/extending.md's plugins in a real run: loaded with --plugin-dir in every process, and
the page's storage, reward, algorithm type, advantage, loss, entropy term, sample strategy,
task selector and monitor all take part in training; its engine runs in a Ray engine actor."""

import json
import math
import os

import pytest

from tests.integration.conftest import base_overrides
from tests.integration.test_run import CONFIG, records, weights_changed
from tests.unit.test_extending_docs import PLUGIN_BLOCKS, REGISTRIES, engine_config
from trinity.common.models.model import ModelWrapper
from trinity.runtime.explorer_role import engine_kwargs
from trinity.runtime.launcher import run


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, code in PLUGIN_BLOCKS:
        (folder / name).write_text(code)
    for registry in REGISTRIES:  # the driver registers them too: drop them afterwards
        monkeypatch.setattr(registry, "_modules", dict(registry._modules))
    return str(folder)


def test_documented_plugins_train(tmp_path, micro_model, arithmetic_data, ray_cluster, plugin_dir):
    # the page's storage reads the taskset: the first 8 training rows, as a TSV file
    with open(os.path.join(arithmetic_data["rl"], "train.jsonl")) as f:
        rows = [json.loads(line) for line in f][:8]
    tsv = tmp_path / "train.tsv"
    lines = ["question\tanswer"] + [f"{r['question']}\t{r['answer']}" for r in rows]
    tsv.write_text("\n".join(lines) + "\n")
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.taskset.storage_type=tsv",
        f"buffer.explorer_input.taskset.path={tsv}",
        "algorithm.algorithm_type=rloo_no_reference",
        "algorithm.advantage_fn=group_mean",
        "algorithm.policy_loss_fn=reinforce",
        "algorithm.entropy_loss_fn=capped_entropy",
        "algorithm.sample_strategy=clip_reward",
        "buffer.explorer_input.taskset.default_workflow_type=simple_workflow",
        "buffer.explorer_input.default_reward_fn_type=keyword_reward",
        "buffer.explorer_input.taskset.task_selector={selector_type: fixed_shuffle}",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=null",  # one epoch of the 8 rows, 4 tasks a step: 2 steps
        "model.max_response_tokens=6",
        "monitor.monitor_type=csv",
        "monitor.monitor_args={prefix: actor/}",
    ]
    (result,) = run(CONFIG, overrides, [plugin_dir])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    # the page's monitor got the trainer's actor/ metrics of both steps, as the JSON lines did
    csv_path = os.path.join(
        result.job_dir, "monitor", f"{os.path.basename(result.job_dir)}_trainer.csv"
    )
    with open(csv_path) as f:
        rows = [line.split(",") for line in f.read().splitlines()]
    assert {(int(step), name) for step, name, _ in rows} == {
        (r["step"], name) for r in trainer for name in r if name.startswith("actor/")
    }
    for record in trainer:
        assert math.isfinite(record["actor/reinforce_loss"])
        assert "group_mean/abs_advantage" in record and "sample/clipped_rewards" in record
        assert "actor/kl_loss" not in record  # rloo_no_reference loads no reference model
    assert weights_changed(micro_model, result.final_hf)


def test_documented_engine_in_a_ray_engine_actor(
    tmp_path, micro_model, arithmetic_data, ray_cluster, plugin_dir
):
    """The Ray host imports the plugin folders itself: this process never registers "echo"."""
    import ray

    from trinity.runtime.actors import EngineActor

    config = engine_config(tmp_path, micro_model, arithmetic_data, "transformers")
    actor = EngineActor.remote(
        "echo",
        [plugin_dir],
        config.checkpoint_job_dir,
        "echo_engine",
        "INFO",
        1,
        **engine_kwargs(config),
    )
    try:
        model = ModelWrapper(actor)
        (reply,) = model.chat([{"role": "user", "content": "12+34="}])
        assert reply.response_text == "12+3" and reply.logprobs.tolist() == [0.0] * 4
        ray.get(actor.load_weights.remote({}, 2))
        assert model.model_version == 2
    finally:
        ray.kill(actor, no_restart=True)
