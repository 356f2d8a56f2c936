"""``synchronizer.sync_method: nccl`` in whole GRPO runs: the trainer broadcasts each version
to the rollout engines over gloo (no GPU here; between GPUs NCCL runs the same code), and
every engine checks what it loaded against the trainer's checksums before it samples."""

import glob
import os

import pytest

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import records, weights_changed
from trinity.demo.tiny import build_tiny_preset
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
NCCL = ["synchronizer.sync_method=nccl", "explorer.runner_per_model=1"]


@pytest.fixture(scope="module")
def quickstart_model(tmp_path_factory) -> str:
    """The quickstart's tiny model (``trinity prepare-quickstart``'s preset)."""
    return build_tiny_preset(str(tmp_path_factory.mktemp("model") / "tiny"), "tiny")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _loaded(job_dir: str, version: int) -> int:
    """How many rollout engines logged taking model ``version``."""
    count = 0
    for path in glob.glob(os.path.join(job_dir, "log", "explorer_engine_*.log")):
        with open(path) as f:
            count += f.read().count(f"rollout engine now at model version {version}\n")
    return count


@pytest.mark.slow
def test_grpo_with_nccl_sync(tmp_path, quickstart_model, arithmetic_data, ray_cluster):
    overrides = base_overrides(tmp_path, quickstart_model, arithmetic_data) + [
        *NCCL,
        "explorer.rollout_model.engine_num=2",  # a group of three: the trainer, two engines
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer, explorer = records(result.job_dir, "trainer"), records(result.job_dir, "explorer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(r["time/sync_weights"] > 0 for r in trainer)
    versions = [r["rollout/model_version"] for r in explorer if "rollout/model_version" in r]
    assert versions == [0, 1, 2]  # on-policy: each step sampled by the weights just sent
    evals = [r["step"] for r in explorer if "eval/arith_test/accuracy/mean" in r]
    assert evals == [0, 2, 3]  # the last one with the trainer's final weights
    assert [_loaded(result.job_dir, v) for v in (1, 2, 3)] == [2, 2, 2]  # each engine, once
    assert weights_changed(quickstart_model, result.final_hf)


@pytest.mark.slow
def test_two_trainer_ranks_send_once_and_resume(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """Rank 0 sends the weights the ranks gather; the run's end publishes its last step
    again, which every rank skips alike; a resumed run sends its resumed weights first."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        *NCCL,
        "trainer.cpu_ranks=2",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    (result,) = run(CONFIG, overrides + ["buffer.total_steps=2"], [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    assert [_loaded(result.job_dir, v) for v in (1, 2)] == [1, 1]
    (again,) = run(CONFIG, overrides + ["buffer.total_steps=3"], [])
    explorer = records(again.job_dir, "explorer")
    assert [r["step"] for r in explorer][-1] == 3
    assert explorer[-1]["rollout/model_version"] == 2  # step 3: the resumed weights, sent
    assert _loaded(again.job_dir, 2) == 2 and _loaded(again.job_dir, 3) == 1


@pytest.mark.slow
def test_grpo_with_nccl_sync_into_vllms_cpu_build(
    tmp_path, micro32_model, arithmetic_data, ray_cluster
):
    """vLLM's CPU workers join no broadcast: the engine's process takes it for them and
    loads them through shared memory, each version checked against the trainer's sums
    twice (what arrived, what the workers hold): a mismatch would stop the run."""
    pytest.importorskip("vllm")
    overrides = base_overrides(tmp_path, micro32_model, arithmetic_data) + [
        *NCCL,
        "explorer.rollout_model.engine_type=vllm",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer, explorer = records(result.job_dir, "trainer"), records(result.job_dir, "explorer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    versions = [r["rollout/model_version"] for r in explorer if "rollout/model_version" in r]
    assert versions == [0, 1, 2]  # on-policy: each step sampled by the weights just sent
    assert [_loaded(result.job_dir, v) for v in (1, 2, 3)] == [1, 1, 1]
    loads = [_read(p) for p in glob.glob(os.path.join(result.job_dir, "log", "*.log"))]
    assert sum(text.count("vllm engine loaded and checked") for text in loads) == 3
