"""The Tinker trainer and engine against the project's own Tinker service on 127.0.0.1
(trinity/tinker/): the updates a built-in loss and a custom loss make are the same update,
the engine's logprobs are the trainer's, the reference is the base model."""

import asyncio
import textwrap

import pytest
import torch

pytest.importorskip("tinker")

from tests.unit.tinker_server import KEY, tinker_server  # noqa: E402
from trinity.common.config import load_config  # noqa: E402
from trinity.common.models.sampling import SamplingParams  # noqa: E402
from trinity.preflight.derive import finalize  # noqa: E402
from trinity.trainer import tinker_mapping as mapping  # noqa: E402
from trinity.trainer.tinker_client import TinkerTrainer  # noqa: E402

CONFIG = """
checkpoint_root_dir: {root}
mode: both
model:
  model_path: {model}
  max_prompt_tokens: 16
  max_response_tokens: 6
  tinker: {{enable: true, rank: 4, seed: 0}}
algorithm:
  algorithm_type: grpo
  repeat_times: 4
  kl_loss_fn: {kl}
  optimizer: {{lr: 0.01}}
buffer:
  batch_size: 1
  explorer_input:
    taskset: {{name: t, path: /d}}
"""


@pytest.fixture(scope="module")
def service_url(micro_model, tmp_path_factory):
    with tinker_server(micro_model, str(tmp_path_factory.mktemp("state"))) as server:
        yield server.url


@pytest.fixture(autouse=True)
def service_env(service_url, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", service_url)
    monkeypatch.setenv("TINKER_API_KEY", KEY)


def trainer(tmp_path, model, kl="none"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(CONFIG.format(root=tmp_path, model=model, kl=kl)))
    config = finalize(load_config(str(path)))
    made = TinkerTrainer(config, planned_steps=4, log=lambda metrics, step: None)
    made.prepare_model()
    return made


def engine(model):
    from trinity.engine.tinker_engine import TinkerInferenceModel

    return TinkerInferenceModel(
        model_path=model,
        base_model=model,
        max_model_len=64,
        max_prompt_tokens=16,
        max_response_tokens=6,
    )


def sample(engine_, prompt, n=4):
    params = SamplingParams(n=n, max_tokens=6, seed=3)
    return asyncio.run(engine_.generate_ids(prompt, params))


def rollouts(model, advantages):
    experiences = sample(engine(model), [5, 9, 13, 17, 21])
    for exp, advantage in zip(experiences, advantages, strict=True):
        exp.advantages = torch.full((exp.response_length,), advantage)
        exp.returns = exp.advantages.clone()
    return experiences


def test_the_engine_samples_logprobs_the_trainer_scores_alike(tmp_path, micro_model):
    policy = trainer(tmp_path, micro_model, kl="k2")  # k2 reads the reference (the base)
    batch = policy._batch(rollouts(micro_model, [1.0, -1.0, 0.5, -0.5]))
    scored = policy._score(policy.model, batch)
    mask = batch.action_mask.bool()
    assert torch.allclose(scored[mask], batch.old_logprob[mask], atol=1e-3)
    # an adapter that has not trained yet scores as its base model does
    reference = policy._score(policy.ref_model, batch)
    assert torch.allclose(reference[mask], scored[mask], atol=1e-3)


def _after_one_update(tmp_path, model, experiences, custom):
    policy = trainer(tmp_path, model)
    if custom:  # the same loss through forward_backward_custom
        policy.plan = mapping.LossPlan(None, why="the test")
    batch = policy._batch(experiences)
    metrics = policy._update_actor(batch)
    return batch, policy._score(policy.model, batch), metrics


def test_builtin_ppo_and_the_custom_loss_make_the_same_update(tmp_path, micro_model):
    experiences = rollouts(micro_model, [1.0, -1.0, 0.5, -0.5])
    batch, builtin, metrics = _after_one_update(tmp_path / "a", micro_model, experiences, False)
    _, custom, _ = _after_one_update(tmp_path / "b", micro_model, experiences, True)
    mask = batch.action_mask.bool()
    assert (builtin[mask] - batch.old_logprob[mask]).abs().max() > 1e-3  # the policy moved
    assert torch.allclose(builtin[mask], custom[mask], atol=1e-4)
    assert metrics["actor/lr"] == pytest.approx(0.01) and metrics["actor/grad_norm"] > 0


def test_the_openai_compatible_server_serves_the_tinker_engine(micro_model):
    from tests.unit.test_openai_server import LocalServer

    host = LocalServer(engine(micro_model), micro_model)
    try:
        client = host.client()
        reply = client.chat.completions.create(
            model=client.model_path,
            messages=[{"role": "user", "content": "1+1="}],
            max_tokens=4,
            n=2,
            logprobs=True,
        )
    finally:
        host.close()
    assert len(reply.choices) == 2
    assert all(len(c.logprobs.content) >= 1 for c in reply.choices)
