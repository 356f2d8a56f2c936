"""``model.tinker`` and ``engine_type: tinker`` before start (trinity/preflight/tinker_checks.py):
what they derive, what they ignore and say so, what they refuse, and the service's answer."""

import http.server
import json
import logging
import textwrap
import threading
from importlib.metadata import version

import pytest

import trinity.engine.tinker_service as service
from trinity.common.config import load_config
from trinity.preflight.derive import derive
from trinity.preflight.tinker_checks import idle_keys, service_problems

BASE = """
mode: {mode}
model: {{model_path: /tok, max_prompt_tokens: 8, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 4}}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {{name: t, path: /d}}
"""
ON = "model.tinker.enable=true"


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")


def derived(tmp_path, overrides, mode="both"):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE.format(mode=mode)))
    return derive(load_config(str(path), list(overrides)))


def test_enable_derives_the_engine_base_model_and_no_hf_export(tmp_path):
    config, problems = derived(tmp_path, [ON, "model.tinker.rank=8"])
    assert problems == []
    assert config.explorer.rollout_model.engine_type == "tinker"
    assert config.model.tinker.base_model == "/tok"  # model.model_path as written
    assert config.trainer.save_hf_checkpoint == "never"
    assert config.model.tinker.rank == 8


def test_an_explicit_base_model_is_kept(tmp_path):
    config, _ = derived(tmp_path, [ON, "model.tinker.base_model=Org/Base-1B"])
    assert config.model.tinker.base_model == "Org/Base-1B"


def test_lora_configs_are_ignored_with_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        config, problems = derived(tmp_path, [ON, "model.lora_configs=[{lora_rank: 4}]"])
    assert problems == [] and config.model.lora_configs is None
    (line,) = [r.getMessage() for r in caplog.records if "lora_configs" in r.getMessage()]
    assert line.startswith("model.lora_configs is ignored: with model.tinker.enable")


def test_sync_method_and_trainer_layout_keys_are_listed_as_unused(tmp_path):
    overrides = [ON, "synchronizer.sync_method=checkpoint", "trainer.use_dynamic_bsz=false"]
    config, problems = derived(tmp_path, overrides)
    assert problems == []
    found = {path: why for path, _, why in idle_keys(config)}
    assert set(found) == {"synchronizer.sync_method", "trainer.use_dynamic_bsz"}
    assert "weights move through the Tinker service" in found["synchronizer.sync_method"]


@pytest.mark.parametrize(
    "overrides, start",
    [
        (
            ["explorer.rollout_model.engine_type=transformers"],
            "explorer.rollout_model.engine_type = transformers: with model.tinker.enable",
        ),
        (
            ["buffer.explorer_input.taskset.rollout_args.temperature=0.7"],
            "the training rollouts' temperature is 0.7",
        ),
        (
            ["algorithm.entropy_loss_fn_args={entropy_coef: 0.01}"],
            "algorithm.entropy_loss_fn = default",
        ),
        (
            ["trainer.cpu_ranks=2"],
            "trainer.cpu_ranks = 2: with model.tinker.enable the Tinker service trains",
        ),
        (
            ["trainer.save_hf_checkpoint=last"],
            "trainer.save_hf_checkpoint = last: a Tinker run's weights stay",
        ),
        (["model.repetition_penalty=1.1"], "model.repetition_penalty = 1.1: the Tinker API has no"),
        (
            ["model.min_response_tokens=2"],
            "model.min_response_tokens = 2: the Tinker API has no minimum",
        ),
        (["algorithm.algorithm_type=ppo"], "algorithm.algorithm_type = ppo trains a critic"),
        (["algorithm.advantage_fn=clipb"], "algorithm.advantage_fn = clipb reads the entropy"),
        (
            [
                "algorithm.algorithm_type=on_policy_distill",
                "explorer.auxiliary_models=[{model_path: /t}]",
            ],
            "algorithm.algorithm_type = on_policy_distill scores with a teacher",
        ),
    ],
)
def test_what_a_tinker_run_cannot_do_is_refused_by_name(tmp_path, overrides, start):
    _, problems = derived(tmp_path, [ON, *overrides])
    assert [p for p in problems if p.startswith(start)], problems


def test_the_engine_without_a_tinker_trainer_is_refused(tmp_path):
    _, problems = derived(tmp_path, ["explorer.rollout_model.engine_type=tinker"])
    assert problems == [
        "explorer.rollout_model.engine_type = tinker samples the adapter a Tinker trainer "
        "saves: set model.tinker.enable: true (and TINKER_BASE_URL)"
    ]


def test_tinker_runs_train_in_modes_both_and_train_only(tmp_path):
    sft = [
        "algorithm.algorithm_type=sft",
        "buffer.trainer_input.experience_buffer={name: s, path: /s}",
    ]
    _, problems = derived(tmp_path, [ON, *sft], mode="train")
    assert problems == []
    _, problems = derived(tmp_path, [ON], mode="explore")
    assert problems == [
        "model.tinker.enable = true is not supported yet: a Tinker run is mode both (with "
        "engine_type tinker) or train, not explore (supported: false)"
    ]


def test_the_api_key_must_be_set(tmp_path, monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY")
    config, problems = derived(tmp_path, [ON])
    assert problems == []
    assert service_problems(config) == [
        "model.tinker.enable: the environment variable TINKER_API_KEY is not set; the Tinker "
        "SDK sends it to the service (a service that checks no key takes any tml- value)"
    ]


def test_auxiliary_models_do_not_sample_through_tinker(tmp_path):
    auxiliary = "explorer.auxiliary_models=[{engine_type: tinker, model_path: j}]"
    _, problems = derived(tmp_path, [ON, auxiliary])
    assert problems == [
        "explorer.auxiliary_models[0].engine_type = tinker is not supported yet: the tinker "
        "engine serves only the rollout model (the adapter a Tinker run trains) (supported: "
        "transformers, external, vllm, unset)"
    ]


def test_a_silent_service_is_named_after_bounded_attempts(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "PROBE_BACKOFF_S", (0.0,))
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    config, _ = derived(tmp_path, [ON])
    (line,) = service_problems(config)
    assert line.startswith(
        "model.tinker.enable: the Tinker service at http://127.0.0.1:9 (TINKER_BASE_URL) did "
        "not answer 4 attempts"
    )
    assert "Connect" in line


class _OlderService(http.server.BaseHTTPRequestHandler):
    """Capabilities as the SDK asks them, but no ``POST /api/v1/client/config``: a service
    written for an SDK older than the installed one (as skyrl-tx 0.3.0 is for tinker 0.38)."""

    def do_GET(self):
        body = json.dumps({"supported_models": [{"model_name": "/tok"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_service_that_does_not_speak_this_sdk_version_is_refused_before_start(
    tmp_path, monkeypatch
):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OlderService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("TINKER_BASE_URL", url)
    try:
        config, _ = derived(tmp_path, [ON])
        (line,) = service_problems(config)
    finally:
        server.shutdown()
    assert line == (
        f"model.tinker.enable: the Tinker service at {url} answered HTTP 404 to POST "
        f"/api/v1/client/config, the first call of a session of the installed SDK (tinker "
        f"{version('tinker')}): it does not speak this SDK version's API; install the SDK "
        "version the service was written for, or use a service that takes this one"
    )


def test_a_base_model_the_service_does_not_list_is_named_with_what_it_lists():
    capabilities = {"supported_models": [{"model_name": "Org/A"}, {"model_name": "Org/B"}]}
    assert service.base_model_problem(capabilities, "Org/A", "k") is None
    assert service.base_model_problem(capabilities, "Org/C", "model.tinker.base_model") == (
        f"model.tinker.base_model = Org/C: the Tinker service at {service.service_url()} does "
        "not hold this base model (it lists: Org/A, Org/B); name one of those"
    )


class _Pending:
    """An SDK future whose result never comes."""

    def result(self, timeout=None):
        raise TimeoutError


def test_a_wait_on_a_service_that_stopped_answering_ends_naming_it(monkeypatch):
    monkeypatch.setattr(service, "PROBE_BACKOFF_S", (0.0,))
    monkeypatch.setattr(service, "WAIT_SLICE_S", 0.01)
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    with pytest.raises(service.TinkerUnavailable) as info:
        service.wait_result(_Pending(), "optim_step")
    text = str(info.value)
    assert text.startswith("optim_step: the Tinker service at http://127.0.0.1:9 (TINKER_BASE_URL)")
    assert "run it again once the service answers, and it resumes from the last one" in text
