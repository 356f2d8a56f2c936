"""A screenshot of the MLflow UI showing a real run's metrics (docs/results/mlflow_ui.png).

Starts a local MLflow tracking server (SQLite store in a temporary folder), runs a short
GRPO job of the micro model on synthetic arithmetic with ``monitor_type: mlflow`` pointed at
it (the product's own sink, in the roles' Ray actors), then has headless Chromium from
Debian (``apt-get install -y chromium chromium-driver``) load the trainer run's metric
charts and save a PNG.
The server is stopped at the end. It measures nothing and asserts nothing. It needs MLflow in
full, whose tracking server it starts: the ``dev`` extra (``pip install -e ".[dev]"``); the
``mlflow`` extra is the client only.

Usage::

    python bench/mlflow_ui.py --out docs/results/mlflow_ui.png
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Optional

CONFIG = """\
project: monitors
name: grpo_micro
mode: both
checkpoint_root_dir: {root}/checkpoints
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 4, optimizer: {{lr: 1e-3}}}}
buffer:
  batch_size: 4
  total_steps: {steps}
  explorer_input:
    default_workflow_type: math_workflow
    taskset:
      name: arith_train
      path: {data}
      split: train
      format: {{prompt_key: question, response_key: answer}}
    eval_tasksets:
      - name: arith_test
        path: {data}
        split: test
        format: {{prompt_key: question, response_key: answer}}
        rollout_args: {{temperature: 0.0}}
explorer: {{eval_interval: 2, eval_on_startup: true}}
monitor:
  monitor_type: mlflow
  monitor_args: {{uri: "{uri}"}}
"""
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1600,1400",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: str, port: int, timeout_s: float = 600.0) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--default-artifact-root", f"{root}/artifacts",
    ]  # fmt: skip
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = open(os.path.join(root, "server.log"), "w")  # open as long as the server runs
    server = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return server
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"mlflow server exited; see {root}/server.log") from None
            time.sleep(1)
    stop_server(server)
    raise RuntimeError(f"mlflow server not up after {timeout_s} s; see {root}/server.log")


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def run_job(root: str, uri: str, steps: int) -> None:
    """The GRPO job, logging both roles to ``uri``."""
    from trinity.demo.synthetic import make_arithmetic
    from trinity.demo.tiny import build_tiny_preset
    from trinity.runtime.launcher import run

    model = build_tiny_preset(os.path.join(root, "micro"), "micro")
    data = os.path.join(root, "data")
    make_arithmetic(data, n_train=64, n_test=16, digits=1, seed=0)
    config = os.path.join(root, "grpo_micro.yaml")
    with open(config, "w") as f:
        f.write(CONFIG.format(root=root, model=model, data=data, steps=steps, uri=uri))
    run(config, [], [])


def metrics_url(uri: str, project: str, run_name: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(project).experiment_id
    (found,) = client.search_runs([experiment], f"attributes.run_name = '{run_name}'")
    return f"{uri}/#/experiments/{experiment}/runs/{found.info.run_id}/model-metrics"


class WebDriver:
    """Just enough of the W3C WebDriver protocol, spoken to Debian's chromedriver, to load a
    page, wait for it in real time and take a screenshot (Chromium's own ``--screenshot``
    shoots when the page has loaded, before the charts have fetched their data)."""

    def __init__(self, profile: str) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen(
            ["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(100):
            try:
                self._call("GET", "/status")
                break
            except OSError:
                time.sleep(0.2)
        options = {
            "binary": "/usr/bin/chromium",
            "args": [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"],
        }
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options}
        session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        self.session = f"/session/{session['sessionId']}"

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())["value"]

    def open(self, url: str) -> None:
        self._call("POST", f"{self.session}/url", {"url": url})

    def run(self, script: str) -> Any:
        return self._call("POST", f"{self.session}/execute/sync", {"script": script, "args": []})

    def screenshot(self, out: str) -> None:
        with open(out, "wb") as f:
            f.write(base64.b64decode(self._call("GET", f"{self.session}/screenshot")))

    def quit(self) -> None:
        self._call("DELETE", self.session)
        self.driver.terminate()
        self.driver.wait()


def screenshot(url: str, out: str, profile: str, timeout_s: float = 180.0) -> None:
    """The page once its charts (Plotly SVGs) stop appearing, the assistant panel closed."""
    browser = WebDriver(profile)
    try:
        browser.open(url)
        count, steady, deadline = 0, 0, time.monotonic() + timeout_s
        while steady < 5 and time.monotonic() < deadline:
            time.sleep(1)
            now = browser.run("return document.querySelectorAll('svg.main-svg').length")
            steady = steady + 1 if now == count and now > 0 else 0
            count = now
        browser.run(
            "const b = document.querySelector('button[aria-label=\"Close\"]'); if (b) b.click();"
        )
        time.sleep(2)
        browser.screenshot(out)
    finally:
        browser.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/results/mlflow_ui.png")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps of the job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        port = free_port()
        uri = f"http://127.0.0.1:{port}"
        server = start_server(root, port)
        try:
            run_job(root, uri, args.steps)
            url = metrics_url(uri, "monitors", "grpo_micro_trainer")
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            screenshot(url, args.out, os.path.join(root, "chromium"))
        finally:
            stop_server(server)
    print(f"wrote {args.out} ({url})")


if __name__ == "__main__":
    main()
