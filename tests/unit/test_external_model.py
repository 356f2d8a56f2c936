"""External models: the config rules (one switch, never trained, env vars checked before
start) and ``ExternalModel`` against the project's own server over real HTTP on 127.0.0.1."""

import asyncio
import os
import pickle
import shutil
import textwrap

import pytest
from transformers import AutoTokenizer

from tests.unit.test_openai_server import LocalServer, make_engine
from trinity.common.config import ConfigError, load_config
from trinity.common.config.schema_model import ExternalModelConfig
from trinity.common.models.model import ModelWrapper
from trinity.common.models.sampling import SamplingParams
from trinity.engine.external import NO_KEY, ExternalModel, external_env
from trinity.preflight.before_start import check_before_start
from trinity.preflight.derive import derive
from trinity.preflight.model_folders import tokenizer_folder_problems
from trinity.runtime.explorer_role import external_engine

BASE = """
model: {model_path: /m, max_prompt_tokens: 8, max_response_tokens: 4}
algorithm: {algorithm_type: grpo, repeat_times: 4}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: t, path: /d}
"""
AUX = "explorer.auxiliary_models"
ENABLED = "external_model: {enable: true}"
TRAINED = (
    "model.external_model.enable: an external model cannot be trained (no weight sync to an "
    "API), so mode both cannot run; use mode: explore (or bench to evaluate it)"
)


def derived(tmp_path, overrides):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE))
    return derive(load_config(str(path), list(overrides)))


@pytest.mark.parametrize(
    "aux",
    [
        "{engine_type: external, model_path: judge}",
        "{external_model: {enable: true, model_name: judge}}",
    ],
)
def test_either_key_makes_an_auxiliary_model_external(tmp_path, aux):
    config, problems = derived(tmp_path, [f"{AUX}=[{aux}]"])
    (entry,) = config.explorer.auxiliary_models
    assert problems == []
    assert entry.engine_type == "external" and entry.external_model.enable is True


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            [f"{AUX}=[{{engine_type: transformers, model_path: j, {ENABLED}}}]"],
            f"{AUX}[0].external_model.enable = true contradicts {AUX}[0].engine_type = "
            "transformers; set only one (engine_type: external is enable: true)",
        ),
        (
            [f"{AUX}=[{{engine_type: external}}]"],
            f"{AUX}[0].external_model.model_name is required (the model name sent to the API)",
        ),
        (["model.external_model.enable=true"], TRAINED),
        (
            ["explorer.rollout_model.engine_type=external", "mode=train"],
            "explorer.rollout_model.engine_type = external: an external model cannot be trained "
            "(no weight sync to an API), so mode train cannot run; use mode: explore (or bench to "
            "evaluate it)",
        ),
        (
            ["model.external_model.enable=true", "mode=explore"]
            + ["explorer.rollout_model.enable_history=true"],
            "explorer.rollout_model.enable_history = true with model.external_model.enable: an "
            "API's replies carry no token ids to record; set enable_history: false",
        ),
        (
            ["mode=explore", "explorer.rollout_model.external_model.model_name=gpt"],
            "explorer.rollout_model.external_model: the rollout model's API is set in "
            "model.external_model; move it there",
        ),
        (
            ["algorithm.algorithm_type=on_policy_distill"]
            + [f"{AUX}=[{{engine_type: external, model_path: teacher}}]"],
            f"{AUX}[0].engine_type = external: on_policy_distill scores with the teacher's "
            "weights in the trainer, which an API does not give; use a local model",
        ),
        (
            ["model.external_model.enable=true", "mode=explore"]
            + ["explorer.rollout_model.enable_thinking=true"],
            "explorer.rollout_model.enable_thinking with engine_type external is not supported "
            "yet: the API's server applies its own chat template; remove the key",
        ),
        (
            ["mode=explore"]
            + [f"{AUX}=[{{engine_type: external, model_path: j, enable_auto_tool_choice: true}}]"],
            f"{AUX}[0].enable_auto_tool_choice with engine_type external is not supported yet: "
            "the API's server decides whether it takes tool_choice auto; remove the key",
        ),
    ],
)
def test_external_config_mistakes(tmp_path, overrides, expected):
    _, problems = derived(tmp_path, overrides)
    assert expected in problems, problems


def test_an_external_rollout_model_explores(tmp_path):
    config, problems = derived(tmp_path, ["model.external_model.enable=true", "mode=explore"])
    assert problems == [] and config.explorer.rollout_model.engine_type == "external"
    config, problems = derived(tmp_path, ["explorer.rollout_model.engine_type=external"])
    assert config.model.external_model.enable is True
    assert problems == [
        "explorer.rollout_model.engine_type = external: an external model cannot be trained "
        "(no weight sync to an API), so mode both cannot run; use mode: explore (or bench to "
        "evaluate it)"
    ]


def test_the_tinker_engine_serves_no_auxiliary_model(tmp_path):
    _, problems = derived(tmp_path, [f"{AUX}=[{{engine_type: tinker, model_path: j}}]"])
    # the rest is checked with a supported engine in its place: lines about it are left out
    assert [p.split(" (")[0] for p in problems] == [
        f"{AUX}[0].engine_type = tinker is not supported yet: the tinker engine serves only the "
        "rollout model"
    ]


GOOD = """
checkpoint_root_dir: {root}
mode: {mode}
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4{external}}}
algorithm: {{algorithm_type: grpo, repeat_times: 4}}
buffer:
  batch_size: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset:
      name: t
      path: {data}
      format: {{prompt_key: question, response_key: answer}}
"""


def checked(tmp_path, model, data, extra="", mode="both", external=""):
    path = tmp_path / "c.yaml"
    text = GOOD.format(root=tmp_path / "ck", mode=mode, model=model, data=data, external=external)
    path.write_text(text + textwrap.dedent(extra))
    return check_before_start(load_config(str(path)))


JUDGE = """
explorer:
  auxiliary_models:
    - {engine_type: external, model_path: judge, external_model: {base_url_env: TEST_JUDGE_URL}}
"""


def test_the_base_url_variable_is_checked_before_start(
    tmp_path, micro_model, arithmetic_data, monkeypatch
):
    monkeypatch.delenv("TEST_JUDGE_URL", raising=False)
    with pytest.raises(ConfigError) as info:
        checked(tmp_path, micro_model, arithmetic_data["rl"], JUDGE)
    assert info.value.problems == [
        f"{AUX}[0].external_model.base_url_env = TEST_JUDGE_URL: the environment variable "
        "TEST_JUDGE_URL is not set; export it to the API's base URL (e.g. http://host:8000/v1)"
    ]
    monkeypatch.setenv("TEST_JUDGE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a key is optional
    # the auxiliary model_path is a name sent to the API, not a folder to check
    (stage,) = checked(tmp_path, micro_model, arithmetic_data["rl"], JUDGE)
    assert external_env(stage) == {"TEST_JUDGE_URL": "http://127.0.0.1:1/v1"}
    # what the launcher hands the explorer: the variables the external models name, if set
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://not-used/v1")
    assert external_env(stage) == {"TEST_JUDGE_URL": "http://127.0.0.1:1/v1", "OPENAI_API_KEY": "k"}


def test_an_external_rollout_model_needs_only_a_tokenizer_folder(
    tmp_path, micro_model, arithmetic_data, monkeypatch
):
    tokenizer_only = tmp_path / "tok"
    shutil.copytree(micro_model, tokenizer_only)
    os.remove(tokenizer_only / "model.safetensors")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "secret")
    external = ", external_model: {enable: true}"
    data = arithmetic_data["rl"]
    (stage,) = checked(tmp_path, tokenizer_only, data, mode="explore", external=external)
    assert external_env(stage) == {
        "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
        "OPENAI_API_KEY": "secret",
    }
    assert tokenizer_folder_problems("model.model_path", str(tmp_path)) == [
        f"model.model_path = {tmp_path}: no tokenizer files (tokenizer.json, "
        "tokenizer_config.json, tokenizer.model, vocab.json)"
    ]


# ---- ExternalModel against the project's server -------------------------------------------
@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


@pytest.fixture
def external(local, micro_model):
    return ExternalModel(f"{local.server.url}/v1", "key", micro_model, tokenizer_path=micro_model)


def test_chat_returns_the_apis_replies_as_experiences_of_the_local_tokenizer(
    external, local, micro_model
):
    messages = [{"role": "user", "content": "1+1="}]
    params = SamplingParams(n=2, seed=5, max_tokens=6, top_k=5)
    experiences = asyncio.run(external.chat(messages, params))
    direct = local.client().chat.completions.create(
        model=micro_model, messages=messages, n=2, seed=5, max_tokens=6, extra_body={"top_k": 5}
    )
    tokenizer = AutoTokenizer.from_pretrained(micro_model)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(experiences) == 2
    for exp, choice in zip(experiences, direct.choices, strict=True):
        assert exp.response_text == choice.message.content
        assert exp.info["finish_reason"] == choice.finish_reason
        assert exp.tokens[: exp.prompt_length].tolist() == prompt_ids
        response = tokenizer.encode(exp.response_text, add_special_tokens=False)
        assert exp.tokens[exp.prompt_length :].tolist() == response
        assert exp.prompt_text == prompt and exp.logprobs is None


def test_generate_uses_completions_and_the_wrapper_sends_its_defaults(external, micro_model):
    wrapper = ModelWrapper(pickle.loads(pickle.dumps(external)), {"max_tokens": 3})
    (exp,) = wrapper.generate(["12+3="], seed=1)
    tokenizer = AutoTokenizer.from_pretrained(micro_model)
    assert exp.tokens[: exp.prompt_length].tolist() == tokenizer.encode("12+3=")
    assert exp.info["finish_reason"] in ("stop", "length") and len(exp.response_text) <= 3
    assert wrapper.model_version == 0


def test_requests_that_need_the_apis_token_ids_are_refused(external):
    messages = [{"role": "user", "content": "1+1="}]
    with pytest.raises(ValueError, match="top_logprobs and stop_token_ids"):
        asyncio.run(external.chat(messages, SamplingParams(top_logprobs=2)))
    with pytest.raises(RuntimeError, match="takes no weights"):
        asyncio.run(external.load_weights({}, 1))


def test_wrapper_clients_point_at_the_api_with_its_key(external, micro_model):
    assert external.client is external.client  # opened once; pickling must leave it behind
    copy = pickle.loads(pickle.dumps(external))
    assert copy._client is None and copy._tokenizer is None
    wrapper = ModelWrapper(copy)
    client = wrapper.get_openai_client()
    assert str(client.base_url) == f"{external.base_url}/" and client.api_key == "key"
    assert client.model_path == micro_model
    assert [m.id for m in client.models.list().data] == [micro_model]
    assert wrapper.get_openai_client() is client

    async def one_reply() -> str:
        async_client = wrapper.get_openai_async_client()
        reply = await async_client.chat.completions.create(
            model=async_client.model_path,
            messages=[{"role": "user", "content": "2"}],
            max_tokens=2,
        )
        return reply.choices[0].finish_reason

    assert asyncio.run(one_reply()) in ("stop", "length")


def test_from_config_reads_the_named_variables(monkeypatch):
    monkeypatch.delenv("EXT_URL", raising=False)
    external = ExternalModelConfig(base_url_env="EXT_URL", api_key_env="EXT_KEY")
    with pytest.raises(ValueError, match=r"^k.base_url_env = EXT_URL: the environment variable"):
        ExternalModel.from_config(external, "k", "name")
    monkeypatch.setenv("EXT_URL", "http://api/v1")
    monkeypatch.delenv("EXT_KEY", raising=False)
    found = ExternalModel.from_config(external, "k", "fallback")
    assert (found.base_url, found.api_key, found.model) == ("http://api/v1", NO_KEY, "fallback")
    monkeypatch.setenv("EXT_KEY", "sk")
    named = ExternalModelConfig(base_url_env="EXT_URL", api_key_env="EXT_KEY", model_name="gpt")
    found = ExternalModel.from_config(named, "k", "fallback")
    assert (found.api_key, found.model) == ("sk", "gpt")


def test_the_explorer_builds_each_api_from_its_own_section(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://rollout/v1")
    monkeypatch.setenv("JUDGE_URL", "http://judge/v1")
    judge_env = "external_model: {base_url_env: JUDGE_URL}"
    aux = f"{AUX}=[{{engine_type: external, model_path: j, {judge_env}}}]"
    overrides = ["mode=explore", "model.external_model.enable=true", aux]
    config, problems = derived(tmp_path, overrides)
    assert problems == []
    rollout = external_engine(config)
    assert (rollout.base_url, rollout.model, rollout.tokenizer_path) == (
        "http://rollout/v1",
        "/m",
        "/m",
    )
    judge = external_engine(config, config.explorer.auxiliary_models[0])
    assert (judge.base_url, judge.model, judge.tokenizer_path) == ("http://judge/v1", "j", None)
