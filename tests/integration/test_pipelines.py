"""Data pipelines in a real run: the task pipeline decides what is explored, the experience
pipeline what the trainer reads, and steps stay accounted when a step is filtered empty."""

import os
import socket

import pytest

from tests.integration.conftest import HERE
from tests.integration.test_run import records
from trinity.demo.synthetic import read_jsonl, write_jsonl
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def overrides(tmp_path, micro_model, data_dir, pipelines):
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"buffer.explorer_input.taskset.path={data_dir}",
        "buffer.explorer_input.eval_tasksets=[]",
        "explorer.eval_on_startup=false",
        "buffer.total_steps=null",
        "buffer.total_epochs=1",
        f"data_processor={pipelines}",
    ]


def repeated_taskset(tmp_path, arithmetic_data, distinct: int, copies: int) -> str:
    """``distinct`` questions of the arithmetic set, each ``copies`` times in a row."""
    rows = read_jsonl(os.path.join(arithmetic_data["rl"], "train.jsonl"))[:distinct]
    folder = tmp_path / "repeated"
    write_jsonl(str(folder / "train.jsonl"), [r for r in rows for _ in range(copies)])
    return str(folder)


def test_task_and_experience_pipelines(tmp_path, micro_model, arithmetic_data, ray_cluster):
    # 8 distinct tasks x 3 copies: 6 explore steps of 4 tasks without the task pipeline,
    # 2 once the deduplicator has kept the 8 distinct ones. Greedy sampling makes the 4
    # rollouts of a task identical: the experience deduplicator keeps one per group.
    data = repeated_taskset(tmp_path, arithmetic_data, distinct=8, copies=3)
    pipelines = (
        "{task_pipeline: {operators: [{name: deduplicator}]},"
        " experience_pipeline: {operators: [{name: deduplicator}]}}"
    )
    greedy = ["buffer.explorer_input.taskset.rollout_args.temperature=0.0"]
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, data, pipelines) + greedy, [])
    trainer = records(result.job_dir, "trainer")
    explorer = records(result.job_dir, "explorer")
    assert [r["step"] for r in explorer] == [1, 2] and [r["step"] for r in trainer] == [1, 2]
    with open(os.path.join(result.job_dir, "log", "explorer.log")) as f:
        assert "task pipeline on taskset 'arith_train': deduplicator 24 -> 8" in f.read()
    for explored, trained in zip(explorer, trainer, strict=True):
        assert explored["pipeline/experiences_in"] == 16  # 4 tasks x 4 rollouts
        assert explored["pipeline/deduplicator/dropped"] == 12
        assert explored["pipeline/experiences_out"] == 4
        assert trained["sample/experience_count"] == 4  # the trainer read what was kept
        assert "actor/pg_loss" in trained


def test_a_step_filtered_empty_is_still_a_step(tmp_path, micro_model, arithmetic_data, ray_cluster):
    data = repeated_taskset(tmp_path, arithmetic_data, distinct=8, copies=1)
    pipelines = (
        "{experience_pipeline: {operators: [{name: reward_filter, args: {min_reward: 10}}]}}"
    )
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, data, pipelines), [])
    trainer = records(result.job_dir, "trainer")
    assert [(r["step"], r["sample/experience_count"]) for r in trainer] == [(1, 0), (2, 0)]
    assert all("actor/pg_loss" not in r for r in trainer)  # nothing trained, nothing hung
    explorer = records(result.job_dir, "explorer")
    assert [r["pipeline/reward_filter/dropped"] for r in explorer] == [16, 16]


def test_guide_data_juicer_scores_then_reward_shaping(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """The guide's experience pipeline: Data-Juicer scores each response (here its length,
    ``text_len``), ``reward_shaping_mapper`` adds the score to the reward, and the trainer
    trains on the shaped rewards. Data-Juicer runs in the service the operator starts."""
    pytest.importorskip("data_juicer")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = repeated_taskset(tmp_path, arithmetic_data, distinct=4, copies=1)
    pipelines = (
        "{experience_pipeline: {operators: ["
        "{name: data_juicer, args: {operators: [{text_length_filter: {min_len: 0}}]}},"
        " {name: reward_shaping_mapper, args: {reward_shaping_configs:"
        " [{stats_key: text_len, op_type: ADD, weight: 1.0}]}}]}}"
    )
    service = [f"service.data_juicer={{auto_start: true, port: {port}}}"]
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, data, pipelines) + service, [])
    (explored,) = records(result.job_dir, "explorer")
    (trained,) = records(result.job_dir, "trainer")
    shaped = (
        explored["rollout/reward/mean"]
        + explored["pipeline/reward_shaping_mapper/reward_diff/mean"]
    )
    assert explored["pipeline/reward_shaping_mapper/missing_stats"] == 0
    assert explored["pipeline/reward_shaping_mapper/reward_diff/max"] > 0  # lengths were added
    assert trained["critic/rewards/mean"] == pytest.approx(shaped, abs=1e-5)
    with socket.socket() as s:  # the service stopped with the run
        assert s.connect_ex(("127.0.0.1", port)) != 0
