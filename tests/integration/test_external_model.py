"""External models: whole runs whose judge or rollout model is an OpenAI-compatible API in
another process (the project's own server, ``trinity.engine.standalone``), reached through
the URL in ``OPENAI_BASE_URL`` as a user's API would be; the server requires an API key,
which the run's clients send from the variable ``api_key_env`` names."""

import json
import os
import select
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import HERE, base_overrides
from trinity.buffer.codec import decode_experience
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
START_TIMEOUT_S = 180
API_KEY = "external-key"


@pytest.fixture(scope="module")
def api_url(micro_model):
    """The base URL of the micro model served in a subprocess; the process is killed after."""
    code = (
        "from trinity.engine.standalone import serve; "
        f"serve({micro_model!r}, max_model_len=256, max_response_tokens=8)"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRINITY_API_KEY": API_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            line = proc.stdout.readline().strip() if ready else ""
        assert line.startswith("http://127.0.0.1:"), f"the server did not start: {line!r}"
        yield line
    finally:
        proc.kill()
        proc.wait(timeout=30)


def records(job_dir: str, role: str) -> list:
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


def stored(job_dir: str) -> list:
    db = os.path.join(job_dir, "buffer", "experience_buffer.db")
    with sqlite3.connect(db) as conn:
        return [
            decode_experience(blob)
            for (blob,) in conn.execute("SELECT data FROM experience_buffer")
        ]


def test_a_judge_behind_an_external_api_scores_a_grpo_run(
    tmp_path, micro_model, arithmetic_data, ray_cluster, api_url, monkeypatch
):
    # set after Ray started: the launcher must hand it to the explorer itself
    monkeypatch.setenv("JUDGE_BASE_URL", api_url)
    monkeypatch.setenv("JUDGE_API_KEY", API_KEY)
    api = "{base_url_env: JUDGE_BASE_URL, api_key_env: JUDGE_API_KEY, model_name: micro}"
    judge = f"{{engine_type: external, external_model: {api}}}"
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_workflow_type=llm_judge_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=2",
        f"explorer.auxiliary_models=[{judge}]",
    ]
    (result,) = run(CONFIG, overrides, [])
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]
    rows = stored(result.job_dir)
    assert len(rows) == 2 * 4 * 4
    for exp in rows:  # every answer went to the judge, whose reply decided the reward
        verdict = exp.info["judge_reply"]
        assert isinstance(verdict, str)
        assert exp.reward == float(verdict.strip().lower().startswith("yes"))
    logs = os.listdir(os.path.join(result.job_dir, "log"))
    assert not [name for name in logs if "auxiliary" in name]  # no engine was started


@pytest.fixture
def rollout_api(api_url, monkeypatch):
    """The served micro model as the rollout model's API (model.external_model's variables)."""
    monkeypatch.setenv("OPENAI_BASE_URL", api_url)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)


def test_an_external_rollout_model_is_evaluated_in_explore_mode(
    tmp_path, micro_model, arithmetic_data, ray_cluster, rollout_api
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "mode=explore",
        "model.external_model.enable=true",
        "buffer.total_steps=2",
    ]
    (result,) = run(CONFIG, overrides, [])
    explorer = records(result.job_dir, "explorer")
    eval_steps = [r["step"] for r in explorer if "eval/arith_test/accuracy/mean" in r]
    assert eval_steps == [0, 2]  # startup and eval_interval (= the last step)
    assert [r["rollout/model_version"] for r in explorer if "rollout/model_version" in r] == [0, 0]
    rows = stored(result.job_dir)
    assert len(rows) == 2 * 4 * 4
    for exp in rows:  # the API's text, tokens re-tokenized locally, no logprobs
        assert exp.response_text is not None and exp.logprobs is None
        assert exp.prompt_text.endswith("<|im_start|>assistant\n")
    assert not [
        name for name in os.listdir(os.path.join(result.job_dir, "log")) if "engine" in name
    ]


def test_an_external_rollout_model_is_benched_once(
    tmp_path, micro_model, arithmetic_data, ray_cluster, rollout_api
):
    """0.5.2's bench example evaluates an API model: it has no checkpoints, so it is evaluated
    once, as step 0."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "mode=bench",
        "model.external_model.enable=true",
        "explorer.eval_on_startup=false",
    ]
    (result,) = run(CONFIG, overrides, [])
    (record,) = records(result.job_dir, "bench")
    assert record["step"] == 0 and 0.0 <= record["bench/arith_test/accuracy/mean"] <= 1.0
