"""``trinity run`` with ``model.tinker.enable: true``: GRPO trains a LoRA adapter in the
project's own Tinker service (started here on 127.0.0.1, reached through TINKER_BASE_URL as
any service would be) and samples it there; a rerun resumes the adapter from the state the
checkpoint names."""

import json
import os

import pytest

pytest.importorskip("tinker")

from tests.integration.conftest import HERE, base_overrides  # noqa: E402
from tests.integration.test_external_model import records, stored  # noqa: E402
from tests.unit.tinker_server import KEY, tinker_server  # noqa: E402
from trinity.runtime.launcher import run  # noqa: E402

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


@pytest.fixture(scope="module")
def service_url(micro_model, tmp_path_factory):
    with tinker_server(micro_model, str(tmp_path_factory.mktemp("tinker-state"))) as server:
        yield server.url


@pytest.fixture
def tinker_env(service_url, monkeypatch):
    # set after Ray started: the launcher hands them to the roles itself
    monkeypatch.setenv("TINKER_BASE_URL", service_url)
    monkeypatch.setenv("TINKER_API_KEY", KEY)


def overrides(tmp_path, micro_model, arithmetic_data, steps, *extra):
    return base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "model.tinker.enable=true",
        "model.tinker.rank=4",
        "buffer.explorer_input.eval_tasksets=[]",
        f"buffer.total_steps={steps}",
        *extra,
    ]


def extra_json(job_dir, step):
    with open(os.path.join(job_dir, f"global_step_{step}", "extra.json")) as f:
        return json.load(f)


def test_grpo_trains_two_steps_through_tinker(
    tmp_path, micro_model, arithmetic_data, ray_cluster, tinker_env
):
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, arithmetic_data, 2), [])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    # the experiences' logprobs are the service sampler's: the trainer's forward agrees
    assert all(abs(r["actor/ppo_kl"]) < 1e-3 for r in trainer)
    assert all(r["actor/kl_loss"] == pytest.approx(0.0, abs=1e-3) for r in trainer)
    rows = stored(result.job_dir)
    assert len(rows) == 2 * 4 * 4 and all(e.logprobs is not None for e in rows)
    assert sorted({e.model_version for e in rows}) == [0, 1]  # step 2 sampled version 1
    saved = extra_json(result.job_dir, 2)["tinker"]
    assert saved["state_path"].startswith("tinker://") and saved["base_model"] == micro_model
    with open(os.path.join(result.job_dir, "log", "trainer.log")) as f:
        log = f.read()
    # GRPO's k2 KL loss is no built-in loss: this project's losses on the service's logprobs
    assert "Tinker: forward_backward_custom, because of the KL loss" in log


def test_a_rerun_resumes_the_adapter_and_its_optimizer(
    tmp_path, micro_model, arithmetic_data, ray_cluster, tinker_env
):
    fast = "algorithm.kl_loss_fn=none"  # the built-in ppo loss
    (first,) = run(CONFIG, overrides(tmp_path, micro_model, arithmetic_data, 1, fast), [])
    state = extra_json(first.job_dir, 1)["tinker"]["state_path"]
    (second,) = run(CONFIG, overrides(tmp_path, micro_model, arithmetic_data, 2, fast), [])
    assert [r["step"] for r in records(second.job_dir, "trainer")] == [1, 2]
    with open(os.path.join(second.job_dir, "log", "trainer.log")) as f:
        log = f.read()
    assert "Tinker: built-in loss ppo" in log
    assert f"Tinker: resumed the adapter and optimizer of {state}" in log


def test_sft_trains_through_the_builtin_cross_entropy(
    tmp_path, micro_model, arithmetic_data, ray_cluster, tinker_env
):
    data = (
        f"{{name: sft, storage_type: file, path: {arithmetic_data['sft']}, "
        "format: {prompt_key: prompt, response_key: response}}"
    )
    sft = [
        "mode=train",
        "algorithm.algorithm_type=sft",
        "algorithm.optimizer.lr=0.01",
        "buffer.train_batch_size=16",
        f"buffer.trainer_input.experience_buffer={data}",
    ]
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, arithmetic_data, 3, *sft), [])
    losses = [r["actor/sft_loss"] for r in records(result.job_dir, "trainer")]
    assert len(losses) == 3 and losses[2] < losses[0]
    with open(os.path.join(result.job_dir, "log", "trainer.log")) as f:
        assert "Tinker: built-in loss cross_entropy" in f.read()


def test_dpo_trains_through_the_custom_loss_against_the_base_model(
    tmp_path, micro_model, arithmetic_data, ray_cluster, tinker_env
):
    from tests.integration.test_algorithms import dpo_data

    pairs = (
        f"{{name: pairs, storage_type: file, path: {dpo_data(tmp_path)}, format: "
        "{prompt_key: prompt, chosen_key: chosen, rejected_key: rejected}}"
    )
    dpo = [
        "mode=train",
        "algorithm.algorithm_type=dpo",
        "buffer.train_batch_size=8",
        f"buffer.trainer_input.experience_buffer={pairs}",
    ]
    (result,) = run(CONFIG, overrides(tmp_path, micro_model, arithmetic_data, 2, *dpo), [])
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    # step 1: the adapter has not trained yet, so the policy is its reference, the base
    assert trainer[0]["actor/dpo_loss"] == pytest.approx(0.6931, abs=1e-3)  # -log sigmoid(0)
