"""`mode: serve` end to end: a real run of examples/serve/serve.yaml on the micro model, and
outside clients in processes of their own (examples/serve/client.py: only the `openai`
package and urllib) that chat, post rewards and commit episodes while the run trains."""

import glob
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List

import pytest

from tests.integration.conftest import HERE, ROOT
from tests.integration.test_run import records, weights_changed
from trinity.common.config.base import ConfigError
from trinity.runtime.failures import RunFailed
from trinity.runtime.launcher import run

CONFIG = os.path.join(ROOT, "examples", "serve", "serve.yaml")
CLIENT = os.path.join(ROOT, "examples", "serve", "client.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeRun:
    """``trinity run`` of the serve example in a thread of this process."""

    def __init__(self, overrides: List[str], plugin_dirs: List[str] = ()) -> None:
        self.outcome: Dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(overrides, list(plugin_dirs)))
        self.thread.start()

    def _run(self, overrides: List[str], plugin_dirs: List[str]) -> None:
        try:
            self.outcome["results"] = run(CONFIG, overrides, plugin_dirs)
        except BaseException as exc:  # reported by the test
            self.outcome["error"] = exc

    def wait_until_serving(self, url: str, timeout: float = 300) -> None:
        # generous: on a loaded 2-core machine Ray's actors and the engine took over 60 s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.thread.is_alive():
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                return
            except urllib.error.HTTPError:  # it answers (401 when it requires a key)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"the endpoint never answered at {url}: {self.outcome}")

    def join(self, timeout: float = 60) -> Dict[str, Any]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not end"
        return self.outcome


def client(url: str, samples: int) -> Dict[str, Any]:
    """Run the example client in its own process; its JSON summary."""
    done = subprocess.run(
        [sys.executable, CLIENT, "--url", url, "--samples", str(samples), "--max-seconds", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def overrides(tmp_path, micro_model, port: int) -> List[str]:
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"explorer.proxy_port={port}",
        "buffer.total_steps=3",
        "buffer.train_batch_size=8",  # two questions of four replies per train step
        "trainer.save_interval=2",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("hosting", ["in_process", "ray"])
def test_clients_chat_reward_and_commit_while_the_run_trains_and_serves_new_weights(
    tmp_path, micro_model, hosting, request, monkeypatch
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = []
    if hosting == "ray":  # the engine, server and roles as Ray actors, with an API key
        request.getfixturevalue("ray_cluster")
        extra = ["cluster.in_process=false"]
        # the launcher hands it to the serving actor; the client sends it (examples/serve)
        monkeypatch.setenv("TRINITY_API_KEY", "integration-key")
    serve = ServeRun(overrides(tmp_path, micro_model, port) + extra)
    serve.wait_until_serving(url)
    tool_reply = ask_with_tools(url)
    seen = client(url, samples=4)
    outcome = serve.join()
    assert "error" not in outcome, outcome.get("error")
    if hosting == "ray":
        logs = open(glob.glob(os.path.join(tmp_path, "quickstart", "serve", "log", "*engine*"))[0])
        assert "(API key required)" in logs.read()
    # the client ran until training ended; no request failed on the way (it would raise)
    assert seen["stopped"].startswith("training has finished")
    assert seen["episodes"] >= 6 and seen["replies"] == 4 * seen["episodes"]
    versions = [v for v in seen["versions"] if v is not None]
    # new weights are picked up between requests; the trainer's last steps publish within a
    # second of each other (their data was all in), so the last reply may precede them
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] >= 1
    (result,) = outcome["results"]
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(r["critic/rewards/mean"] >= 0 for r in trainer)
    assert os.path.isdir(os.path.join(result.job_dir, "global_step_2"))
    assert result.final_hf == os.path.join(result.job_dir, "global_step_3", "hf")
    assert weights_changed(micro_model, result.final_hf)
    trained_replies_are_traceable(result.job_dir, tool_reply)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
]


def ask_with_tools(url: str) -> str:
    """A typical tool request (a system prompt, two tools, tool_choice auto) is served; its
    reply's id."""
    import openai

    # the key a run with one requires (the Ray case sets it), as examples/serve/client.py sends
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("TRINITY_API_KEY", "EMPTY"))
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12+30? And the weather in Paris?"},
    ]
    model = api.models.list().data[0].id
    reply = api.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    return reply.id


def trained_replies_are_traceable(job_dir: str, tool_reply: str) -> None:
    """What the serve guide says: a reply's row in <buffer>_responses names the explore
    step its commit made; `trinity view` lists that step's experiences with their reply ids
    and the train step that read each."""
    import sqlite3

    from trinity.cli.view import Filters, list_rows, locate, open_store, replies

    with sqlite3.connect(os.path.join(job_dir, "buffer", "serve_buffer.db")) as db:
        rows = db.execute(
            "SELECT response_id, committed_step FROM serve_buffer_responses ORDER BY id"
        ).fetchall()
    assert (tool_reply, None) in rows  # served and kept, never rewarded nor committed
    reply, step = next(r for r in rows if r[1] is not None)
    store = open_store(*locate(job_dir)[:2])
    try:
        _, listed = list_rows(store, Filters(step=step, limit=100))
        pairs = zip(listed, replies(listed), strict=True)
        traced = [row.consumed_by for row, r in pairs if r.split("#")[0] == reply]
    finally:
        store.close()
    assert traced and all(train_step is not None for train_step in traced)


def test_a_trainer_failure_reaches_clients_as_a_503_and_fails_the_run(
    tmp_path, micro_model, monkeypatch
):
    from trinity.algorithm import ADVANTAGE_FN

    # the run registers the plugin's advantage in this process too: dropped afterwards
    monkeypatch.setattr(ADVANTAGE_FN, "_modules", dict(ADVANTAGE_FN._modules))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plugins = os.path.join(HERE, "plugins_serve")
    serve = ServeRun(
        overrides(tmp_path, micro_model, port) + ["algorithm.advantage_fn=failing_advantage"],
        [plugins],
    )
    serve.wait_until_serving(url)
    seen = client(url, samples=4)
    assert "the trainer failed (RuntimeError: injected trainer failure)" in seen["stopped"]
    assert "trainer.log" in seen["stopped"]
    error = serve.join()["error"]
    assert isinstance(error, RunFailed)
    assert "the trainer failed: RuntimeError: injected trainer failure" in str(error)


def test_a_busy_port_is_named_before_anything_starts(tmp_path, micro_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            run(CONFIG, overrides(tmp_path, micro_model, port), [])
    assert caught.value.problems == [
        f"explorer.proxy_port = {port}: cannot listen on 127.0.0.1:{port} (Address already in "
        "use); choose a free port (another process may hold this one), or 0 for any free one"
    ]
    assert not os.path.exists(os.path.join(tmp_path, "quickstart", "serve", "log"))


def test_serving_beyond_loopback_without_a_key_is_refused_before_anything_starts(
    tmp_path, micro_model, monkeypatch
):
    monkeypatch.delenv("TRINITY_API_KEY", raising=False)
    overrides_ = overrides(tmp_path, micro_model, free_port()) + ["explorer.listen_address=0.0.0.0"]
    with pytest.raises(ConfigError) as caught:
        run(CONFIG, overrides_, [])
    (problem,) = caught.value.problems
    assert problem.startswith("explorer.listen_address = 0.0.0.0: a server reachable beyond")
    assert "export TRINITY_API_KEY=" in problem
    assert not os.path.exists(os.path.join(tmp_path, "quickstart", "serve", "log"))
