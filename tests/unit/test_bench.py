"""Bench mode without Ray: which checkpoints it takes, what it checks before starting, the
records and the table it makes (the whole mode runs in tests/integration/test_bench_mode.py)."""

import os
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from trinity.common.config import ConfigError, apply_run_name, load_config
from trinity.common.experience import Experience
from trinity.common.weights import complete_steps, weights_path
from trinity.explorer.bench import BenchError, bench_steps, bench_table, run_bench
from trinity.explorer.explorer import rollout_metrics
from trinity.preflight.before_start import check_before_start

CONFIG = os.path.join(os.path.dirname(__file__), "..", "integration", "configs", "grpo_small.yaml")


def fake_checkpoint(job_dir: str, step: int, weights: bool = True) -> None:
    os.makedirs(os.path.dirname(weights_path(job_dir, step)), exist_ok=True)
    if weights:
        open(weights_path(job_dir, step), "wb").close()


@pytest.fixture
def job_dir(tmp_path) -> str:
    """A run's job dir: complete checkpoints 1, 2, 10; a half-written 3; 4 without weights."""
    job = str(tmp_path / "tests" / "grpo_small")
    for step in (1, 2, 10):
        fake_checkpoint(job, step)
    os.makedirs(os.path.join(job, "global_step_3.tmp-123", "actor"))
    fake_checkpoint(job, 4, weights=False)
    return job


def explorer_section(engine_type: str = "transformers", **kw) -> SimpleNamespace:
    keys = {"bench_checkpoints": [], "bench_on_latest_checkpoint": False, "eval_on_startup": True}
    rollout = SimpleNamespace(engine_type=engine_type)
    return SimpleNamespace(**{**keys, **kw}, rollout_model=rollout)


def test_complete_checkpoints_only_in_step_order(job_dir):
    assert complete_steps(job_dir) == [1, 2, 10]


@pytest.mark.parametrize(
    "settings, steps",
    [
        ({}, [0, 1, 2, 10]),  # the base model first, then every complete checkpoint
        ({"eval_on_startup": False}, [1, 2, 10]),
        ({"bench_on_latest_checkpoint": True}, [10]),
        ({"bench_checkpoints": [10, 0, 2, 10]}, [0, 2, 10]),
        # an API's model: no checkpoints of its own, evaluated once as it is
        ({"engine_type": "external", "eval_on_startup": False}, [0]),
    ],
)
def test_bench_steps(job_dir, settings, steps):
    config = SimpleNamespace(explorer=explorer_section(**settings), checkpoint_job_dir=job_dir)
    assert bench_steps(config) == steps


class RecordingExplorer:
    """Stands in for ``Explorer``: records the version it evaluates at each step."""

    def __init__(self) -> None:
        self.version, self.calls = -1, []

    def evaluate(self, step: int, prefix: str = "eval") -> dict:
        self.calls.append((step, prefix, self.version))
        return {f"{prefix}/t/accuracy/mean": step / 10}


def test_run_bench_loads_each_checkpoint_then_evaluates_it():
    explorer, loaded = RecordingExplorer(), []
    records = run_bench(explorer, [0, 2, 5], lambda step: loaded.append(step) or step)
    assert loaded == [0, 2, 5]
    assert explorer.calls == [(0, "bench", 0), (2, "bench", 2), (5, "bench", 5)]
    assert records == [
        {"step": 0, "bench/t/accuracy/mean": 0.0},
        {"step": 2, "bench/t/accuracy/mean": 0.2},
        {"step": 5, "bench/t/accuracy/mean": 0.5},
    ]


def test_run_bench_refuses_weights_other_than_the_checkpoint():
    with pytest.raises(BenchError, match="hold model version 1, not 2"):
        run_bench(RecordingExplorer(), [2], lambda step: 1)


def test_table_has_a_row_per_checkpoint_and_a_column_per_mean_metric():
    records = [
        {"step": 0, "bench/b/reward/mean": 0.25, "bench/a/accuracy/mean": 0.5, "time/bench": 3},
        {"step": 4, "bench/a/accuracy/mean": 0.75, "bench/a/accuracy/max": 1.0},
    ]
    table = bench_table(records, title="bench of run")
    headers = [c.header for c in table.columns]
    assert headers == ["checkpoint step", "a accuracy", "b reward"]
    console = Console(record=True, width=100)
    console.print(table)
    lines = [line.split() for line in console.export_text().splitlines()]
    assert ["│", "0", "(base)", "│", "0.5", "│", "0.25", "│"] in lines
    assert ["│", "4", "│", "0.75", "│", "-", "│"] in lines


def test_logprob_metric_is_the_mean_over_generated_tokens():
    # mean logprob per response: (-1 - 2) / 2 = -1.5 (the masked -3 is an env token); -0.5
    first = Experience(
        tokens=[1, 2, 3, 4], prompt_length=1, logprobs=[-1.0, -3.0, -2.0], action_mask=[1, 0, 1]
    )
    second = Experience(tokens=[1, 2], prompt_length=1, logprobs=[-0.5])
    no_logprobs = Experience(tokens=[1, 2], prompt_length=1)
    metrics = rollout_metrics([first, second, no_logprobs], prefix="eval/t")
    assert metrics["eval/t/logprob/mean"] == pytest.approx(-1.0)
    assert metrics["eval/t/logprob/min"] == pytest.approx(-1.5)
    assert metrics["eval/t/logprob/max"] == pytest.approx(-0.5)
    assert metrics["eval/t/response_length/mean"] == pytest.approx(5 / 3)
    assert isinstance(first.logprobs, torch.Tensor)


def bench_config(tmp_path, model, data, *overrides):
    return load_config(
        CONFIG,
        [
            f"checkpoint_root_dir={tmp_path}",
            f"model.model_path={model}",
            f"buffer.explorer_input.taskset.path={data['rl']}",
            f"buffer.explorer_input.eval_tasksets.0.path={data['rl']}",
            "mode=bench",
            *overrides,
        ],
    )


def test_bench_keeps_the_run_name_and_derives_checkpoint_sync(
    tmp_path, micro_model, arithmetic_data
):
    fake_checkpoint(str(tmp_path / "tests" / "grpo_small"), 1)
    config = bench_config(tmp_path, micro_model, arithmetic_data, "continue_from_checkpoint=false")
    assert apply_run_name(config).name == "grpo_small"  # no <name>_<timestamp>: same job dir
    (stage,) = check_before_start(apply_run_name(config))
    assert stage.synchronizer.sync_method == "checkpoint"


def test_bench_without_checkpoints_names_the_job_dir(tmp_path, micro_model, arithmetic_data):
    with pytest.raises(ConfigError) as info:
        check_before_start(bench_config(tmp_path, micro_model, arithmetic_data))
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    (problem,) = info.value.problems
    assert problem.startswith("mode bench: no complete checkpoint (global_step_N/actor/")
    assert f"in {job_dir}, the job dir of checkpoint_root_dir/project/name" in problem


def test_bench_problems_are_reported_together(tmp_path, micro_model, arithmetic_data):
    fake_checkpoint(str(tmp_path / "tests" / "grpo_small"), 2)
    config = bench_config(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.eval_tasksets=[]",
        "explorer.bench_checkpoints=[0,2,3]",
        "explorer.bench_on_latest_checkpoint=true",
    )
    with pytest.raises(ConfigError) as info:
        check_before_start(config)
    assert sorted(info.value.problems) == sorted(
        [
            "buffer.explorer_input.eval_tasksets is required in mode bench: the tasksets each "
            "checkpoint is evaluated on",
            "explorer.bench_checkpoints and explorer.bench_on_latest_checkpoint = true both "
            "choose the checkpoints to evaluate; set one",
            f"explorer.bench_checkpoints = [0, 2, 3]: no complete checkpoint of step(s) 3 in "
            f"{tmp_path / 'tests' / 'grpo_small'} (steps found: 2)",
        ]
    )


def test_explicit_memory_sync_is_ignored_in_bench(tmp_path, micro_model, arithmetic_data, caplog):
    fake_checkpoint(str(tmp_path / "tests" / "grpo_small"), 1)
    config = bench_config(tmp_path, micro_model, arithmetic_data, "synchronizer.sync_method=memory")
    with caplog.at_level("WARNING", logger="trinity.config"):
        (stage,) = check_before_start(config)
    assert stage.synchronizer.sync_method == "checkpoint"
    assert "synchronizer.sync_method = memory: ignored in mode bench" in caplog.text


def test_bench_of_a_staged_run_benches_the_run_of_every_stage(tmp_path):
    staged = tmp_path / "stages.yaml"
    with open(CONFIG) as f:
        staged.write_text(
            f.read() + "stages:\n  - {stage_name: sft, mode: train}\n  - {stage_name: rl}\n"
        )
    config = load_config(str(staged), ["mode=bench"])
    stages = config.stage_configs()
    assert [(s.name, s.mode) for s in stages] == [
        ("grpo_small_sft", "bench"),
        ("grpo_small_rl", "bench"),
    ]


def test_a_training_yaml_benches_whatever_its_experience_buffer(
    tmp_path, micro_model, arithmetic_data
):
    """Bench reads no experiences: an SFT run's file buffer (mode train only otherwise) and
    a replay buffer (mode both only) are no reason to refuse benchmarking the run."""
    fake_checkpoint(str(tmp_path / "tests" / "grpo_small"), 1)
    sft = arithmetic_data["sft"]
    config = bench_config(
        tmp_path,
        micro_model,
        arithmetic_data,
        f"buffer.trainer_input.experience_buffer={{name: s, storage_type: file, path: {sft}}}",
        "buffer.trainer_input.experience_buffer.replay_buffer.enable=true",
    )
    (stage,) = check_before_start(config)
    assert stage.mode == "bench"
