"""What a ``mode: serve`` config derives and what it refuses before anything starts, each
problem one line naming its key."""

import textwrap

import pytest

from trinity.common.config import load_config
from trinity.common.config.base import ConfigError
from trinity.common.config.config import rollout_temperature
from trinity.preflight.api_checks import api_key_problems
from trinity.preflight.derive import finalize
from trinity.utils.access import is_loopback

SERVE = """
mode: serve
checkpoint_root_dir: /ck
model: {model_path: /m, max_model_len: 64}
algorithm: {algorithm_type: grpo}
buffer: {total_steps: 4, train_batch_size: 8}
"""


def load(tmp_path, overrides=(), text=SERVE):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return load_config(str(path), list(overrides))


def problems(tmp_path, overrides=(), text=SERVE):
    with pytest.raises(ConfigError) as caught:
        finalize(load(tmp_path, overrides, text))
    return caught.value.problems


def test_serve_derives_a_queue_memory_sync_and_the_default_address(tmp_path):
    config = finalize(load(tmp_path))
    assert config.synchronizer.sync_method == "memory"  # trainer and server in one run
    assert config.buffer.trainer_input.experience_buffer.storage_type == "queue"
    assert (config.explorer.listen_address, config.explorer.proxy_port) == ("127.0.0.1", 8010)
    assert rollout_temperature(config) == 1.0  # no taskset: model.temperature, unset 1.0
    warmer = finalize(load(tmp_path, ["model.temperature=0.7"]))
    assert rollout_temperature(warmer) == 0.7
    # a group is what clients give one task_id: repeat_times 1 is no error here
    assert finalize(load(tmp_path, ["algorithm.repeat_times=1"])).algorithm.repeat_times == 1


def test_serve_refuses_what_it_cannot_run_one_line_per_key(tmp_path):
    found = problems(
        tmp_path,
        [
            "buffer.total_steps=null",
            "explorer.rollout_model.engine_num=2",
            "explorer.rollout_model.openai_api_port=9000",
            "synchronizer.sync_offset=1",
            "buffer.explorer_input.taskset.path=/data",
            "cluster.node_num=2",
        ],
    )
    assert any(p.startswith("cluster.node_num = 2: mode serve on several nodes") for p in found)
    assert any(p.startswith("buffer.total_steps is required in mode serve") for p in found)
    assert any(p.startswith("explorer.rollout_model.engine_num = 2: mode serve") for p in found)
    assert any(
        p.startswith("explorer.rollout_model.openai_api_port: mode serve listens at") for p in found
    )
    assert any(p.startswith("synchronizer.sync_offset = 1: mode serve") for p in found)
    assert any(p.startswith("buffer.explorer_input.tasksets: mode serve runs no") for p in found)


@pytest.mark.parametrize(
    "algorithm, why",
    [
        ("sft", "trains on given data"),
        ("dpo", "trains on given data"),
        ("on_policy_distill", "needs a teacher model"),
        ("remax", "greedy response"),
        ("mix", "expert data"),
    ],
)
def test_serve_accepts_rl_algorithms_and_names_why_it_refuses_others(tmp_path, algorithm, why):
    found = problems(tmp_path, [f"algorithm.algorithm_type={algorithm}"])
    line = [p for p in found if p.startswith(f"algorithm.algorithm_type = {algorithm}: ")]
    assert line and why in line[0] and "mode serve trains on the rewards" in line[0]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "rloo", "opmd", "reinforceplusplus"])
def test_serve_runs_these_algorithms(tmp_path, algorithm):
    assert finalize(load(tmp_path, [f"algorithm.algorithm_type={algorithm}"])).mode == "serve"


def test_explorer_driven_sync_is_refused_in_serve(tmp_path):
    found = problems(tmp_path, ["synchronizer.sync_style=explorer_driven"])
    assert any("synchronizer.sync_style = explorer_driven needs mode both" in p for p in found)


NO_KEY = (
    "{key} = {host}: a server reachable beyond this machine needs an API key, and "
    "TRINITY_API_KEY (explorer.api_server.api_key_env) is not set; export TRINITY_API_KEY=<a "
    "secret, e.g. from `openssl rand -hex 32`> (clients send `Authorization: Bearer "
    "<secret>`), or listen on 127.0.0.1"
)

BOTH = (
    SERVE.replace("mode: serve", "mode: both")
    + """explorer:
  rollout_model: {enable_openai_api: true, openai_api_host: 10.0.0.5}
  auxiliary_models:
    - {model_path: /j, openai_api_host: "::"}
    - {model_path: gpt, engine_type: external}
    - {model_path: /k, openai_api_host: "::1"}
"""
)


def test_a_server_beyond_loopback_needs_the_api_key_one_line_each(tmp_path, monkeypatch):
    monkeypatch.delenv("TRINITY_API_KEY", raising=False)
    wildcard = finalize(load(tmp_path, ["explorer.listen_address=0.0.0.0"]))
    assert api_key_problems(wildcard) == [
        NO_KEY.format(key="explorer.listen_address", host="0.0.0.0")
    ]
    explored = load(tmp_path, text=BOTH)  # what is bound is known before derivation
    assert api_key_problems(explored) == [
        NO_KEY.format(key="explorer.rollout_model.openai_api_host", host="10.0.0.5"),
        NO_KEY.format(key="explorer.auxiliary_models[0].openai_api_host", host="::"),
    ]  # the external model binds nothing; ::1 is loopback
    assert api_key_problems(finalize(load(tmp_path, ["explorer.listen_address=localhost"]))) == []
    monkeypatch.setenv("TRINITY_API_KEY", "s3cret")
    assert api_key_problems(wildcard) == api_key_problems(explored) == []
    renamed = load(tmp_path, ["explorer.api_server.api_key_env=MY_KEY"], BOTH)
    assert "MY_KEY (explorer.api_server.api_key_env) is not set" in api_key_problems(renamed)[0]


@pytest.mark.parametrize(
    "host, loopback",
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True)]
    + [("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.4", False)]
    + [("my-host", False), ("", False)],
)
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback
