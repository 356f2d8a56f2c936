"""Two trainer ranks (``trainer.cpu_ranks: 2``, FSDP2 over gloo) in a real GRPO run: the
engine samples with the gathered weights, checkpoints are sharded, and a resumed run
continues from the 2-rank checkpoint."""

import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.integration.conftest import base_overrides
from tests.integration.test_run import CONFIG, records
from trinity.common.weights import weights_path
from trinity.runtime.launcher import RunFailed, run
from trinity.trainer import checkpoint as ckpt


def _explored(job_dir: str, tmp_path, step: int) -> list:
    """Experiences of explore step ``step``, from a copy of the run's queue store."""
    from trinity.buffer import SQLExperienceStore

    copy = os.path.join(tmp_path, "queue_copy.db")
    shutil.copy(os.path.join(job_dir, "buffer", "experience_buffer.db"), copy)
    store = SQLExperienceStore(copy, "experience_buffer")  # the table is the buffer name
    store.unconsume_after(0)  # every row, whichever train step read it
    rows = [exp for _, explored, exp in store.unconsumed() if explored == step]
    store.close()
    return rows


def _scored(model_dir: str, weights: dict, exps: list) -> list:
    """Each experience's response logprobs under ``weights`` (in one process, no sharding)."""
    from trinity.common.experience import ExperienceBatch
    from trinity.trainer.policy_step import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(weights)
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    with torch.no_grad():
        logprob, _ = response_logprobs(model.eval(), batch, with_entropy=False)
    return [logprob[i, : e.response_length] for i, e in enumerate(exps)]


@pytest.mark.slow
def test_two_rank_grpo_syncs_gathered_weights_and_resumes(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "trainer.cpu_ranks=2",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
    ]
    (result,) = run(CONFIG, overrides, [])
    job = result.job_dir
    assert [r["step"] for r in records(job, "trainer")] == [1, 2]
    assert os.path.isfile(os.path.join(job, "log", "trainer_rank_1.log"))
    shards = os.path.join(ckpt.step_dir(job, 2), ckpt.SHARDS_DIR)
    assert sorted(os.listdir(shards)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert AutoModelForCausalLM.from_pretrained(result.final_hf) is not None

    # Explore step 2 sampled with version 1, published by memory from the sharded trainer:
    # its logprobs are those of the gathered weights the step-1 checkpoint holds.
    exps = _explored(job, tmp_path, 2)
    assert len(exps) == 4 * 4
    weights = ckpt.load_weights(weights_path(job, 1))
    for exp, logprob in zip(exps, _scored(micro_model, weights, exps), strict=True):
        assert torch.allclose(exp.logprobs, logprob, atol=1e-4)
    initial = AutoModelForCausalLM.from_pretrained(micro_model).state_dict()
    assert any(not torch.equal(initial[k], weights[k]) for k in initial)  # version 1 trained

    # The resumed run loads the 2-rank checkpoint and trains step 3.
    resumed = [o for o in overrides if not o.startswith("buffer.total_steps")]
    (again,) = run(CONFIG, resumed + ["buffer.total_steps=3"], [])
    assert [r["step"] for r in records(again.job_dir, "trainer")] == [1, 2, 3]
    assert again.final_hf == os.path.join(job, "global_step_3", "hf")

    # With another rank count the checkpoint is refused, naming both counts.
    one_rank = [o for o in resumed if o != "trainer.cpu_ranks=2"] + ["buffer.total_steps=4"]
    with pytest.raises(RunFailed, match=r"written by 2 trainer rank\(s\).*this run has 1"):
        run(CONFIG, one_rank, [])


@pytest.mark.slow
def test_a_rank_that_dies_fails_the_run_naming_it(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    import threading
    import time

    import ray

    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "trainer.cpu_ranks=2",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=3",
    ]
    metrics = os.path.join(tmp_path, "tests", "grpo_small", "monitor", "trainer.jsonl")

    def kill_rank_1_after_step_1() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (
            os.path.exists(metrics) and os.path.getsize(metrics) > 0
        ):
            time.sleep(0.2)
        ray.kill(ray.get_actor("trainer_rank_1"), no_restart=True)

    killer = threading.Thread(target=kill_rank_1_after_step_1, daemon=True)
    killer.start()
    with pytest.raises(RunFailed) as excinfo:
        run(CONFIG, overrides, [])
    killer.join(timeout=10)
    message = str(excinfo.value)
    assert "the trainer rank 1 failed" in message
    assert os.path.join("log", "trainer_rank_1.log") in message
