"""Stages on one machine run in the launcher's process: no Ray, same outputs and errors."""

import errno
import json
import os

import pytest

import trinity.runtime.launcher as launcher
from tests.integration.conftest import HERE, base_overrides
from trinity.runtime.failures import RunFailed
from trinity.runtime.launcher import run
from trinity.trainer import checkpoint

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def sft_overrides(tmp_path, micro_model, arithmetic_data, steps: int) -> list:
    path, fmt = arithmetic_data["sft"], "{prompt_key: prompt, response_key: response}"
    buffer = f"{{name: sft_data, storage_type: file, path: '{path}', format: {fmt}}}"
    return base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "mode=train",
        "algorithm.algorithm_type=sft",
        "buffer.train_batch_size=8",
        f"buffer.total_steps={steps}",
        f"buffer.trainer_input.experience_buffer={buffer}",
    ]


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if the run tries to start (or join) Ray."""

    def refuse(namespace: str) -> None:
        raise AssertionError(f"init_ray({namespace!r}) called for an in-process stage")

    monkeypatch.setattr(launcher, "init_ray", refuse)


def test_an_sft_stage_trains_in_this_process(tmp_path, micro_model, arithmetic_data, no_ray, capfd):
    (result,) = run(CONFIG, sft_overrides(tmp_path, micro_model, arithmetic_data, 3), [])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["actor/sft_loss"] > 0 for r in records)
    assert result.final_hf == os.path.join(result.job_dir, "global_step_3", "hf")
    assert os.path.isfile(os.path.join(result.final_hf, "config.json"))
    with open(os.path.join(result.job_dir, "log", "trainer.log")) as f:
        assert "trainer runs in the launcher's process" in f.read()
    console = capfd.readouterr()
    # transformers' own progress bars and warnings go to the log, as from an actor
    assert "Loading weights" not in console.err + console.out
    assert "step 3/3" in console.out


def test_a_failing_in_process_trainer_names_itself_and_keeps_checkpoints(
    tmp_path, micro_model, arithmetic_data, no_ray, monkeypatch
):
    write = checkpoint._save_torch

    def full_disk(obj, path):
        if "global_step_2" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return write(obj, path)

    monkeypatch.setattr(checkpoint, "_save_torch", full_disk)  # the trainer runs right here
    overrides = sft_overrides(tmp_path, micro_model, arithmetic_data, 3)
    with pytest.raises(RunFailed) as info:
        run(CONFIG, overrides + ["trainer.save_interval=1"], [])
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    log = os.path.join(job_dir, "log", "trainer.log")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("stage 'grpo_small': the trainer failed: CheckpointError: disk full")
    assert "the previous checkpoint (step 1) is intact" in lines[0]
    assert lines[1] == f"full log: {log}"
    with open(log) as f:
        assert "Traceback" in f.read()
    assert checkpoint.latest_step(job_dir) == 1  # the last whole checkpoint stays


def records_of(job_dir: str, role: str) -> list:
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_on_policy_steps(job_dir: str) -> list:
    """Three train steps; explore step s sampled by the weights after s - 1 updates (sync
    offset 0), handed from the trainer to the engine; the explorer's records."""
    trainer, explorer = records_of(job_dir, "trainer"), records_of(job_dir, "explorer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    versions = [r["rollout/model_version"] for r in explorer if "rollout/model_version" in r]
    assert versions == [0, 1, 2]
    return explorer


@pytest.mark.parametrize("mode", ["multi-threading", "asynchronous"])
def test_a_grpo_stage_explores_and_trains_in_this_process(
    tmp_path, micro_model, arithmetic_data, no_ray, mode
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data)
    (result,) = run(CONFIG, overrides + [f"explorer.concurrent_mode={mode}"], [])
    explorer = assert_on_policy_steps(result.job_dir)  # weights handed over in memory
    assert [r["step"] for r in explorer if "eval/arith_test/accuracy/mean" in r] == [0, 2, 3]
    assert result.final_hf == os.path.join(result.job_dir, "global_step_3", "hf")
    # each role logs to its own file, as its actor would
    log = os.path.join(result.job_dir, "log")
    assert {"trainer.log", "explorer.log", "explorer_engine_0.log"} <= set(os.listdir(log))
    assert {"explorer_runner_0.log", "explorer_runner_1.log"} <= set(os.listdir(log))
    with open(os.path.join(log, "explorer_engine_0.log")) as f:
        assert "rollout engine now at model version 2" in f.read()
    with open(os.path.join(log, "explorer.log")) as f:
        text = f.read()
    assert "explorer runs in the launcher's process" in text
    assert "rollout engine now at" not in text  # the engine's records went to its own file


@pytest.mark.slow
def test_a_grpo_stage_on_ray_when_asked_matches_the_in_process_one(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """``cluster.in_process: false``: the same stage, every role an actor, same records."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "cluster.in_process=false"
    ]
    (result,) = run(CONFIG, overrides, [])
    import ray

    assert ray.is_initialized()
    assert_on_policy_steps(result.job_dir)
    with open(os.path.join(result.job_dir, "log", "explorer.log")) as f:
        assert "explorer runs on node" in f.read()


def test_a_trainer_failing_mid_run_in_process_ends_the_stage_naming_it(
    tmp_path, micro_model, arithmetic_data, no_ray, monkeypatch
):
    """The explorer waiting for weights the trainer will never publish does not stall the
    run: the first failure ends it, named, and the last whole checkpoint stays."""
    write = checkpoint._save_torch

    def full_disk(obj, path):
        if "global_step_2" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return write(obj, path)

    monkeypatch.setattr(checkpoint, "_save_torch", full_disk)
    with pytest.raises(RunFailed) as info:
        run(CONFIG, base_overrides(tmp_path, micro_model, arithmetic_data), [])
    first = str(info.value).splitlines()[0]
    assert first.startswith("stage 'grpo_small': the trainer failed: CheckpointError: disk full")
    assert checkpoint.latest_step(os.path.join(tmp_path, "tests", "grpo_small")) == 1


def test_a_colocated_stage_releases_the_engines_weights_while_the_trainer_steps(
    tmp_path, micro_model, arithmetic_data, no_ray
):
    """mode: colocate: trainer and engine in this process on one device; before waiting for
    each new version the engine frees its weights, and the published ones bring them back."""
    from transformers import AutoModelForCausalLM

    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + ["mode=colocate"]
    (result,) = run(CONFIG, overrides, [])
    assert_on_policy_steps(result.job_dir)  # every step sampled with the newest weights
    model = AutoModelForCausalLM.from_pretrained(micro_model)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(os.path.join(result.job_dir, "log", "explorer.log")) as f:
        released = [line for line in f if "engines released" in line]
    # before step 2 (version 1) and before the evaluations after steps 2 and 3 (versions 2
    # and 3); step 3 explores with version 2, already loaded for the evaluation
    assert len(released) == 3
    assert all(f"engines released {size / 1e6:.1f} MB of weights" in line for line in released)


def test_colocate_refuses_what_needs_ray_before_start(tmp_path, micro_model, arithmetic_data):
    from trinity.common.config.base import ConfigError

    overrides = base_overrides(tmp_path, micro_model, arithmetic_data)
    with pytest.raises(ConfigError) as info:
        run(CONFIG, overrides + ["mode=colocate", "cluster.in_process=false"], [])
    assert info.value.problems == [
        "mode colocate runs trainer and engines in one process, but this stage needs Ray "
        "(cluster.in_process is false)"
    ]
