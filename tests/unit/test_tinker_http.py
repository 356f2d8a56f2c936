"""What the Tinker service answers requests the SDK would never send, over plain HTTP and
through the SDK: a 4xx naming the field (or the call), in the SDK's error shape, and the
server answering on; and its API key, required beyond loopback."""

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tests.unit.tinker_server import KEY, request, tinker_server  # noqa: E402
from trinity.tinker.serve import ServeOptions, api_key  # noqa: E402


@pytest.fixture(scope="module")
def server(micro_model, tmp_path_factory):
    with tinker_server(micro_model, str(tmp_path_factory.mktemp("tinker-state"))) as running:
        yield running


def _refused(reply, status, *words):
    code, body = reply
    assert code == status, body
    assert set(body) == {"error", "category"} and body["category"] == "user", body
    for word in words:
        assert word in body["error"], body
    return body["error"]


def test_malformed_bodies_and_unknown_ids_get_a_4xx_naming_the_field(server, micro_model):
    url = server.url
    _refused(request(url, "POST", "/api/v1/create_session", raw=b"{not json"), 400, "body")
    sid = request(url, "POST", "/api/v1/create_session", {"tags": []})[1]["session_id"]
    model = {"session_id": sid, "model_seq_id": 0, "base_model": micro_model}
    for lora, field in (({"rank": "4"}, "lora_config.rank"), ({"rank": 0}, "lora_config.rank")):
        reply = request(url, "POST", "/api/v1/create_model", {**model, "lora_config": lora})
        _refused(reply, 400, field)
    reply = request(
        url,
        "POST",
        "/api/v1/create_model",
        {**model, "lora_config": {"rank": 4}, "base_model": "Qwen/Qwen3-8B"},
    )
    _refused(reply, 404, "base_model", "Qwen/Qwen3-8B", micro_model)
    reply = request(
        url,
        "POST",
        "/api/v1/create_model",
        {**model, "session_id": "nope", "lora_config": {"rank": 4}},
    )
    _refused(reply, 404, "session_id")
    _refused(
        request(url, "POST", "/api/v1/retrieve_future", {"request_id": "x-1"}), 404, "request_id"
    )
    reply = request(url, "POST", "/api/v1/optim_step", {"model_id": "nope", "adam_params": {}})
    _refused(reply, 404, "model_id")
    reply = request(
        url,
        "POST",
        "/api/v1/forward_backward",
        raw=b"\xff\x00garbage",
        headers={"Content-Type": "application/x-protobuf"},
    )
    _refused(reply, 400, "body", "ForwardBackwardRequest")
    _refused(
        request(url, "POST", "/api/v1/forward_backward", {"model_id": "m"}), 400, "Content-Type"
    )
    reply = request(
        url,
        "POST",
        "/api/v1/asample",
        {"prompt": {"chunks": []}, "sampling_params": {"temperature": -1}},
    )
    _refused(reply, 400, "sampling_params.temperature")
    # calls of the SDK this server does not implement, and routes it does not have
    _refused(
        request(url, "POST", "/api/v1/copy_weights", {}),
        404,
        "POST /api/v1/copy_weights",
        "not implemented",
    )
    _refused(request(url, "GET", "/api/v1/no/such/call"), 404, "GET /api/v1/no/such/call")
    # a model made and unloaded over plain HTTP: its id is gone after
    reply = request(url, "POST", "/api/v1/create_model", {**model, "lora_config": {"rank": 2}})
    model_id = reply[1]["model_id"]
    assert request(url, "POST", "/api/v1/retrieve_future", reply[1])[1]["model_id"] == model_id
    reply = request(url, "POST", "/api/v1/unload_model", {"model_id": model_id})
    assert request(url, "POST", "/api/v1/retrieve_future", reply[1])[1]["type"] == "unload_model"
    _refused(request(url, "POST", "/api/v1/get_info", {"model_id": model_id}), 404, "model_id")
    assert request(url, "GET", "/api/v1/healthz") == (200, {"status": "ok"})  # still serving


def _datum(**inputs):
    tokens = [5, 17, 23, 9]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], **inputs},
    )


def test_the_sdk_gets_a_refusal_naming_the_field(server, micro_model):
    client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    try:
        training = client.create_lora_training_client(base_model=micro_model, rank=2).result()
        three = np.zeros(3, dtype=np.float32)
        cases = [
            (lambda: training.forward([_datum()], "gspo"), ["loss_fn", "gspo", "not supported"]),
            (
                lambda: training.forward([_datum(logprobs=three)], "ppo"),
                ["data[0].loss_fn_inputs.advantages", "required"],
            ),
            (
                lambda: training.forward([_datum(logprobs=three, advantages=three)], "dro"),
                ["loss_fn_config.beta"],
            ),
            (
                lambda: training.forward([_datum(mask=three)], "cross_entropy"),
                ["data[0].loss_fn_inputs.mask"],
            ),
            (
                lambda: training.forward(
                    [_datum(weights=np.zeros(2, np.float32))], "cross_entropy"
                ),
                ["loss_fn_inputs.weights", "shape"],
            ),
            (
                lambda: training.forward(
                    [
                        types.Datum(
                            model_input=types.ModelInput.from_ints([1, 2]),
                            loss_fn_inputs={"target_tokens": [3, 10**6]},
                        )
                    ],
                    "cross_entropy",
                ),
                ["target_tokens", "outside"],
            ),
            (lambda: training.forward([_datum()], "ppo", {"clip": 0.1}), ["loss_fn_config.clip"]),
        ]
        for call, words in cases:
            with pytest.raises(tinker.BadRequestError) as raised:
                call().result()
            for word in words:
                assert word in str(raised.value), (words, str(raised.value))
        with pytest.raises(tinker.NotFoundError, match="base_model"):
            client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result()
        sampler = client.create_sampling_client(base_model=micro_model).result()
        prompt = types.ModelInput.from_ints([5] * 300)  # longer than the model's 256 positions
        with pytest.raises(tinker.BadRequestError, match="prompt"):
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
        # the client still works after its refused calls
        assert training.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] > 0
    finally:
        client.close("success").result()


def test_an_api_key_is_required_beyond_loopback_and_checked(micro_model, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="TRINITY_TEST_TINKER_KEY"):
        api_key(ServeOptions(micro_model, host="0.0.0.0", api_key_env="TRINITY_TEST_TINKER_KEY"))
    monkeypatch.setenv("TRINITY_TEST_TINKER_KEY", "plain-key")
    with pytest.raises(ValueError, match="tml-"):
        api_key(ServeOptions(micro_model, api_key_env="TRINITY_TEST_TINKER_KEY"))
    monkeypatch.setenv("TRINITY_TEST_TINKER_KEY", KEY)
    with tinker_server(micro_model, str(tmp_path), api_key_env="TRINITY_TEST_TINKER_KEY") as srv:
        for sent in ({"X-API-Key": ""}, {"X-API-Key": "tml-wrong"}, {"X-API-Key": KEY + "x"}):
            reply = request(srv.url, "GET", "/api/v1/healthz", headers=sent)
            _refused(reply, 401, "X-API-Key", "TRINITY_TEST_TINKER_KEY")
        assert request(srv.url, "GET", "/api/v1/healthz")[0] == 200
        with pytest.raises(tinker.AuthenticationError):
            tinker.ServiceClient(base_url=srv.url, api_key="tml-wrong").create_lora_training_client(
                base_model=micro_model, rank=2
            ).result()
        client = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
        client.create_lora_training_client(base_model=micro_model, rank=2).result()
        client.close("success").result()


def test_the_command_says_what_is_wrong_before_serving(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from trinity.cli.main import app

    missing = str(tmp_path / "no-model")
    result = CliRunner().invoke(app, ["tinker-serve", "--base-model", missing])
    assert result.exit_code == 2
    assert f"--base-model {missing}: no such folder" in result.output
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    result = CliRunner().invoke(
        app, ["tinker-serve", "--base-model", str(tmp_path), "--host", "0.0.0.0"]
    )
    assert result.exit_code == 2 and "TINKER_API_KEY (--api-key-env)" in result.output
