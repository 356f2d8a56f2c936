"""Monitors against real services: an MLflow tracking server this module starts (SQLite
store in a temporary folder, killed at teardown), read back with ``MlflowClient``; and a
tiny `trinity run` logging both roles to it, with the Ray timeline exported."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.integration.conftest import HERE, base_overrides
from trinity.monitor import Monitor, read_metrics
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
START_TIMEOUT_S = 300  # the server imports a lot; a busy CI machine needs minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(uri: str, server: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            with open(log_path) as f:
                raise RuntimeError(f"mlflow server exited ({server.returncode}):\n{f.read()}")
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"mlflow server not healthy after {START_TIMEOUT_S} s (log: {log_path})")


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--default-artifact-root", str(root / "artifacts"),
    ]  # fmt: skip
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no job runner
    log_path = str(root / "server.log")
    with open(log_path, "w") as log:
        # its own process group: the server's workers are stopped with it
        server = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(uri, server, log_path)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def mlflow_runs(uri: str, experiment: str) -> dict:
    """run name -> (run, {metric: [(step, value), ...]}) of an experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = {}
    for item in client.search_runs([client.get_experiment_by_name(experiment).experiment_id]):
        history = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(item.info.run_id, key))
            for key in item.data.metrics
        }
        found[item.info.run_name] = (item, history)
    return found


def test_mlflow_runs_per_role_and_a_resumed_job_continues_them(tmp_path, mlflow_uri):
    job_dir, args = str(tmp_path), {"uri": mlflow_uri}
    for role in ("explorer", "trainer"):
        monitor = Monitor(job_dir, "monitors", "exp", role, "mlflow", args, keep_until=0)
        for step in (1, 2, 3):
            monitor.log({"loss": step / 4, "role/steps": step}, step)
        monitor.close()
    # killed after step 3 with a checkpoint at 2: the trainer redoes 3 and goes on to 5
    monitor = Monitor(job_dir, "monitors", "exp", "trainer", "mlflow", args, keep_until=2)
    for step in (3, 4, 5):
        monitor.log({"loss": step * 10.0, "role/steps": step}, step)
    monitor.close()

    runs = mlflow_runs(mlflow_uri, "monitors")
    assert sorted(runs) == ["exp_explorer", "exp_trainer"]
    explorer, explorer_history = runs["exp_explorer"]
    assert explorer_history["loss"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    trainer, trainer_history = runs["exp_trainer"]
    # step 3 is held once, with the killed attempt's value; then the resumed steps
    assert trainer_history["loss"] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 40.0), (5, 50.0)]
    assert trainer_history["role/steps"] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]
    assert (trainer.info.status, explorer.info.status) == ("FINISHED", "FINISHED")


@pytest.mark.slow
def test_a_run_logs_both_roles_to_mlflow_and_exports_the_ray_timeline(
    tmp_path, micro_model, arithmetic_data, mlflow_uri, ray_cluster
):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "monitor.monitor_type=mlflow",
        f"monitor.monitor_args={{uri: '{mlflow_uri}'}}",
        "monitor.enable_ray_timeline=true",
    ]
    (result,) = run(CONFIG, overrides, [])
    runs = mlflow_runs(mlflow_uri, "tests")  # project: tests
    assert sorted(runs) == ["grpo_small_explorer", "grpo_small_trainer"]
    for role in ("explorer", "trainer"):
        item, history = runs[f"grpo_small_{role}"]
        assert item.info.status == "FINISHED"
        jsonl = read_metrics(os.path.join(result.job_dir, "monitor", f"{role}.jsonl"))
        # every numeric value of the JSON lines is in the MLflow run, at its step
        for key in ("actor/pg_loss", "rollout/model_version", "eval/arith_test/accuracy/mean"):
            expected = [(r["step"], r[key]) for r in jsonl if r.get(key) is not None]
            if expected:
                assert history[key] == expected, key
    trainer_steps = [step for step, _ in runs["grpo_small_trainer"][1]["actor/pg_loss"]]
    assert trainer_steps == [1, 2, 3]

    with open(os.path.join(result.job_dir, "monitor", "timeline.json")) as f:
        events = json.load(f)  # Chrome trace format: a list of events
    assert events and all({"ph", "ts", "name"} <= set(e) for e in events)
    # the actors' calls are there: each role's prepare() and run()
    assert {"prepare", "run"} <= {e["name"] for e in events if e["ph"] == "X"}
