"""The Tinker service (``trinity tinker-serve``) driven by the official SDK over HTTP on
127.0.0.1: LoRA training clients, each built-in loss against its value worked out by hand
from the logprobs ``forward`` returns, AdamW steps checked against torch's AdamW, sampling
checked against the trainer's forward, checkpoints, and several clients on one base model."""

import math

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tests.unit.tinker_server import KEY, checkpoint_folder, checkpoint_tensors, tinker_server  # noqa: E402


@pytest.fixture(scope="module")
def server(micro_model, tmp_path_factory):
    with tinker_server(micro_model, str(tmp_path_factory.mktemp("tinker-state"))) as running:
        yield running


@pytest.fixture
def client(server):
    service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    yield service
    service.close("success").result()


def _datum(tokens, **inputs):
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], **inputs},
    )


TOKENS = [5, 17, 23, 9, 31, 12, 40]  # six targets


def _logprobs(result):
    return np.asarray(result.loss_fn_outputs[0]["logprobs"].data, dtype=np.float64)


def test_lora_training_client_is_created_on_the_served_base_model(server, client, micro_model):
    training = client.create_lora_training_client(
        base_model=micro_model, rank=4, seed=3, train_mlp=False, train_unembed=False
    ).result()
    info = training.get_info()
    assert info.is_lora and info.lora_rank == 4
    assert info.model_data.model_name == micro_model
    assert training.get_tokenizer().encode("1+1") == training.get_tokenizer().encode("1+1")
    config = server.service.trainer.peft_config(training.model_id)
    assert config.r == 4 and config.lora_alpha == 32
    assert config.target_modules and all("attn" in m for m in config.target_modules)
    # a fresh adapter (B = 0) computes the base model's logprobs
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(micro_model)
    with torch.no_grad():
        expected = -_nll(base, TOKENS, [1.0] * 6)
    forward = training.forward([_datum(TOKENS)], "cross_entropy").result()
    assert _logprobs(forward).sum() == pytest.approx(float(expected), abs=1e-4)
    capabilities = tinker.RestClient(base_url=server.url, api_key=KEY)
    names = [m.model_name for m in capabilities.get_server_capabilities().result().supported_models]
    assert names == [micro_model]


@pytest.mark.parametrize("loss", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_each_built_in_loss_matches_its_definition(client, micro_model, loss):
    training = client.create_lora_training_client(base_model=micro_model, rank=2, seed=0).result()
    lp = _logprobs(training.forward([_datum(TOKENS)], "cross_entropy").result())
    n = len(lp)
    q = lp + np.array([0.5, -0.5, 0.05, 0.0, 0.3, -0.1])  # the sampler's logprobs
    adv = np.array([1.0, -2.0, 0.5, 0.0, -1.0, 2.0])
    weights = np.array([0.0, 1.0, 1.0, 2.0, 1.0, 0.5])
    r = np.exp(lp - q)
    config = None
    if loss == "cross_entropy":
        inputs = {"weights": weights.astype(np.float32)}
        expected = -(lp * weights).sum()
    else:
        inputs = {"logprobs": q.astype(np.float32), "advantages": adv.astype(np.float32)}
    if loss == "importance_sampling":
        expected = -(r * adv).sum()
    elif loss == "ppo":
        config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
        expected = -np.minimum(r * adv, np.clip(r, 0.7, 1.3) * adv).sum()
    elif loss == "cispo":
        expected = -(np.clip(r, 0.8, 1.2) * lp * adv).sum()  # the default range
    elif loss == "dro":
        config = {"beta": 0.1}
        expected = -(lp * adv - 0.05 * (lp - q) ** 2).sum()
    q32 = q.astype(np.float32)  # what travels: float32
    if loss != "cross_entropy":
        r32 = np.exp(lp - q32)
        assert np.allclose(r32, r, atol=1e-6)
    result = training.forward_backward([_datum(TOKENS, **inputs)], loss, config).result()
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert np.allclose(_logprobs(result), lp, atol=1e-5)  # the outputs: target logprobs
    assert len(result.loss_fn_outputs[0]["logprobs"].data) == n


def _replica(server, path):
    """The adapter of a checkpoint on a fresh copy of the base model (peft), trainable."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(server.service.served.path)
    return PeftModel.from_pretrained(base, checkpoint_folder(server, path), is_trainable=True)


def _nll(model, tokens, weights):
    logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0].log_softmax(-1)
    picked = logits.gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    return -(picked * torch.tensor(weights)).sum()


def test_optim_step_is_torch_adamw_with_the_params_sent(server, client, micro_model):
    training = client.create_lora_training_client(base_model=micro_model, rank=4, seed=1).result()
    start = training.save_state("adam-start").result().path
    replica = _replica(server, start)
    params = {n: p for n, p in replica.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(list(params.values()), lr=0.0)
    steps = [
        (TOKENS, [1.0] * 6, types.AdamParams(learning_rate=0.05, beta1=0.8, beta2=0.9, eps=1e-6)),
        (
            [3, 8, 13, 21, 34, 2],
            [1.0, 0.5, 1.0, 0.0, 2.0],
            types.AdamParams(learning_rate=0.02, weight_decay=0.1, eps=1e-8),
        ),
    ]
    for tokens, weights, adam in steps:
        datum = _datum(tokens, weights=np.asarray(weights, dtype=np.float32))
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(adam).result()
        for group in optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        _nll(replica, tokens, weights).backward()
        optimizer.step()
        optimizer.zero_grad()
    served = checkpoint_tensors(server, training.save_state("adam-end").result().path)
    before = checkpoint_tensors(server, start)
    for name, param in params.items():
        key = name.replace(".default", "")
        assert torch.allclose(served[key], param.detach(), atol=1e-5), name
    assert any(not torch.equal(served[k], before[k]) for k in served)  # the steps moved it


def test_sampled_logprobs_equal_the_trainers_forward(server, client, micro_model):
    training = client.create_lora_training_client(base_model=micro_model, rank=4, seed=2).result()
    training.forward_backward([_datum(TOKENS)], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=0.05)).result()
    path = training.save_weights_for_sampler("after-one-step").result().path
    replica = _replica(server, path).eval()
    prompt = TOKENS[:4]
    for sampler in (
        client.create_sampling_client(model_path=path).result(),
        training.save_weights_and_get_sampling_client().result(),
    ):
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[])
        reply = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
        assert len(reply.sequences) == 3
        for seq in reply.sequences:
            assert len(seq.tokens) == 6 and seq.stop_reason == "length"
            full = prompt + seq.tokens
            with torch.no_grad():
                scores = replica(input_ids=torch.tensor([full])).logits[0].log_softmax(-1)
            expected = [float(scores[len(prompt) - 1 + i, t]) for i, t in enumerate(seq.tokens)]
            assert np.allclose(seq.logprobs, expected, atol=1e-3)
        prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
        trained = _logprobs(training.forward([_datum(TOKENS)], "cross_entropy").result())
        assert prompt_lp[0] is None
        assert np.allclose(prompt_lp[1:], trained, atol=1e-3)
    # the engine is back on the base model's weights for a base-model sampler
    base = client.create_sampling_client(base_model=micro_model).result()
    fresh = client.create_lora_training_client(base_model=micro_model, rank=2).result()
    untrained = _logprobs(fresh.forward([_datum(TOKENS)], "cross_entropy").result())
    base_lp = base.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert np.allclose(base_lp[1:], untrained, atol=1e-4)
    assert not np.allclose(untrained, trained, atol=1e-3)


def test_several_training_clients_keep_separate_adapters(server, client, micro_model):
    first = client.create_lora_training_client(base_model=micro_model, rank=4, seed=0).result()
    second = client.create_lora_training_client(
        base_model=micro_model, rank=8, train_unembed=False
    ).result()
    adapters = server.service.trainer.model.peft_config
    names = {server.service.trainer.adapters[t.model_id].name for t in (first, second)}
    assert names <= set(adapters) and len(names) == 2  # two adapters on one base model
    base = _logprobs(second.forward([_datum(TOKENS)], "cross_entropy").result())
    for _ in range(3):
        first.forward_backward([_datum(TOKENS)], "cross_entropy").result()
        first.optim_step(types.AdamParams(learning_rate=0.05)).result()
    trained = _logprobs(first.forward([_datum(TOKENS)], "cross_entropy").result())
    untouched = _logprobs(second.forward([_datum(TOKENS)], "cross_entropy").result())
    assert trained.sum() > base.sum() + 0.1  # training raised the targets' likelihood
    assert np.allclose(untouched, base, atol=1e-6)  # the other adapter did not move


def test_a_saved_state_resumes_with_its_optimizer(server, client, micro_model):
    training = client.create_lora_training_client(base_model=micro_model, rank=4, seed=5).result()
    adam = types.AdamParams(learning_rate=0.03)
    training.forward_backward([_datum(TOKENS)], "cross_entropy").result()
    training.optim_step(adam).result()
    path = training.save_state("resume").result().path
    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    for model in (training, resumed):  # the same next step from the same state
        model.forward_backward([_datum(TOKENS)], "cross_entropy").result()
        model.optim_step(adam).result()
    one = checkpoint_tensors(server, training.save_state("a").result().path)
    two = checkpoint_tensors(server, resumed.save_state("b").result().path)
    assert all(torch.allclose(one[k], two[k], atol=1e-6) for k in one)
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    run = rest.get_training_run(training.model_id).result()
    assert run.last_checkpoint.tinker_path.endswith("/weights/a")
    listed = rest.list_checkpoints(training.model_id).result().checkpoints
    assert [c.checkpoint_id for c in listed] == ["weights/resume", "weights/a"]
    assert not math.isnan(float(one[next(iter(one))].sum()))


def test_forward_backward_custom_runs_the_loss_client_side(server, client, micro_model):
    """The SDK's custom losses run client-side: a forward, then a weighted cross_entropy with
    the loss's gradient as weights; a custom weighted NLL then steps as the built-in does."""
    custom = client.create_lora_training_client(base_model=micro_model, rank=4, seed=4).result()
    builtin = client.create_lora_training_client(base_model=micro_model, rank=4, seed=4).result()
    weights = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.0, 1.0])

    def weighted_nll(data, logprobs):
        loss = -(logprobs[0] * weights).sum()
        return loss, {"custom/nll:sum": float(loss)}

    lp = _logprobs(custom.forward([_datum(TOKENS)], "cross_entropy").result())
    out = custom.forward_backward_custom([_datum(TOKENS)], weighted_nll).result()
    assert out.metrics["loss:sum"] == pytest.approx(-(lp * weights.numpy()).sum(), rel=1e-4)
    builtin.forward_backward([_datum(TOKENS, weights=weights.numpy())], "cross_entropy").result()
    for model in (custom, builtin):
        model.optim_step(types.AdamParams(learning_rate=0.05)).result()
    one = checkpoint_tensors(server, custom.save_state("custom").result().path)
    two = checkpoint_tensors(server, builtin.save_state("builtin").result().path)
    assert all(torch.allclose(one[k], two[k], atol=1e-6) for k in one)
