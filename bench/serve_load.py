"""Load on a ``mode: serve`` run while it trains: N concurrent clients for a fixed time, each
chatting through the ``openai`` package, posting rewards and committing episodes.

Each client is one user in a loop: it asks an addition ``--samples`` times (one chat
completion each), posts a reward per reply (``/feedback``, the question as ``task_id``) and
commits the question (``/commit``). A request refused with a 503 or lost to a dropped
connection is counted and sent again, as a real client would, so an episode survives a
restart of the run. The run is ``trinity run`` of ``examples/serve/serve.yaml`` in a process
group of its own, training on the commits as they come.

After ``--seconds`` the clients stop; committed replies are topped up to whole train
batches and the bench waits until the trainer has trained them all, then stops the run and
counts, from its database and metrics, every committed reply written once and trained once
(``bench/kill_matrix.py``'s accounting). With ``--kill-at S`` the run is killed with SIGKILL
S seconds into the load and started again with the same command while the clients go on.

    python bench/serve_load.py --clients 8 --seconds 60 --out docs/results/serve_load.json
    python bench/serve_load.py --model ./smollm2/model --overrides model.max_prompt_tokens=96

It measures; ``tests/integration/test_serve_load.py`` runs a short one and asserts. It needs
the ``bench`` extra (``pip install -e ".[bench]"``: httpx).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any, Dict, List, Optional

import httpx
import openai
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.kill_matrix import (  # noqa: E402
    SERVE_CONFIG,
    accounting,
    kill_group,
    serve_accounting,
    start,
    trainer_lines,
)
from trinity.trainer.distributed import free_port  # noqa: E402

KEY_ENV = "TRINITY_API_KEY"  # the run's explorer.api_server.api_key_env


def _headers() -> Dict[str, str]:
    key = os.environ.get(KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


class Tally:
    """Latency per kind of request and errors by kind and status, from every client; the
    clients stop starting episodes once ``stop`` is set, and give up on any request once
    ``give_up`` is."""

    def __init__(self) -> None:
        self.stop, self.give_up = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.seconds: Dict[str, List[float]] = {"chat": [], "feedback": [], "commit": []}
        self.errors: Counter = Counter()
        self.committed = 0  # replies the clients saw committed

    def done(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.seconds[kind].append(seconds)

    def failed(self, kind: str, status: Any) -> None:
        with self.lock:
            self.errors[f"{kind} {status}"] += 1


class Retry(Exception):
    """Send the request again after ``wait`` seconds (a 503, or the run is restarting)."""

    def __init__(self, wait: float) -> None:
        super().__init__(wait)
        self.wait = wait


class Client(threading.Thread):
    """One user asking, rewarding and committing until ``stop`` is set (see the module
    docstring); ``name`` makes its task ids unique."""

    def __init__(self, url: str, model: str, samples: int, tally: Tally, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.url, self.model, self.samples, self.tally = url, model, samples, tally
        key = os.environ.get(KEY_ENV) or "EMPTY"
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        self.http = httpx.Client(base_url=url, headers=_headers(), timeout=120)
        self.rng, self.episodes = random.Random(name), 0

    def run(self) -> None:
        while not self.tally.stop.is_set():
            self.episode()

    def episode(self) -> bool:
        """One question asked, rewarded and committed; False when stopped before the end."""
        a, b = self.rng.randrange(100), self.rng.randrange(100)
        question, task_id = f"{a}+{b}=", f"{self.name}-{self.episodes}"
        self.episodes += 1
        replies = [self._send("chat", self._chat, question) for _ in range(self.samples)]
        for reply in replies:
            if reply is None:
                return False
            reward = 1.0 if (reply.choices[0].message.content or "").strip() == str(a + b) else 0.0
            body = {"reward": reward, "msg_ids": [reply.id], "task_id": task_id}
            if self._send("feedback", self._post, "/feedback", body) is None:
                return False
        result = self._send("commit", self._post, "/commit", {"task_id": task_id})
        if result is not None and result.get("experiences"):
            with self.tally.lock:
                self.tally.committed += result["experiences"]
        return result is not None

    def _send(self, kind: str, call: Any, *args: Any) -> Any:
        """``call(*args)`` until it succeeds (its result) or is refused for good or the
        clients stop (None); each try timed, each failure counted."""
        while True:
            began = time.monotonic()
            try:
                result = call(*args)
            except Retry as again:
                # once stopped, an episode that has all its replies is still committed
                if self.tally.give_up.is_set() or (self.tally.stop.is_set() and kind == "chat"):
                    return None
                time.sleep(again.wait)
                continue
            except _Refused as refused:
                self.tally.failed(kind, refused.status)
                return None
            self.tally.done(kind, time.monotonic() - began)
            return result

    def _chat(self, question: str) -> Any:
        messages = [{"role": "user", "content": question}]
        try:
            return self.openai.chat.completions.create(
                model=self.model, messages=messages, max_tokens=8
            )
        except openai.APIStatusError as exc:
            if exc.status_code == 503:
                self.tally.failed("chat", 503)
                raise Retry(float(exc.response.headers.get("retry-after", 1))) from None
            raise _Refused(exc.status_code) from None
        except openai.APIConnectionError:
            self.tally.failed("chat", "connection")
            raise Retry(0.2) from None

    def _post(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        try:
            reply = self.http.post(path, json=body)
        except httpx.TransportError:
            self.tally.failed(path.strip("/"), "connection")
            raise Retry(0.2) from None
        if reply.status_code == 503:
            self.tally.failed(path.strip("/"), 503)
            raise Retry(float(reply.headers.get("retry-after", 1)))
        if reply.status_code == 409 and path == "/commit":  # committed before a restart
            self.tally.failed("commit", 409)
            return {"experiences": 0}
        if reply.status_code != 200:
            raise _Refused(reply.status_code)
        return reply.json()


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def wait_until_serving(url: str, run: Any, timeout: float = 300) -> float:
    """Seconds until ``url`` answers ``/health``; raises if the run ends or time is up."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if run.poll() is not None:
            raise RuntimeError(f"the run ended with code {run.returncode} before serving")
        try:
            request = urllib.request.Request(f"{url}/health", headers=_headers())
            urllib.request.urlopen(request, timeout=2).close()
            return time.monotonic() - began
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def server_rss_mb(run: Any, port: int) -> Optional[float]:
    """Resident memory of the process listening on ``port`` (the run's own process when the
    stage runs in it, else the engine actor), in MiB."""
    processes = [psutil.Process(run.pid)]
    processes += processes[0].children(recursive=True)
    for process in processes:
        try:
            listening = [c for c in process.net_connections("tcp") if c.status == "LISTEN"]
            if any(c.laddr.port == port for c in listening):
                return round(process.memory_info().rss / 2**20, 1)
        except psutil.Error:
            continue
    return None


def percentiles(seconds: List[float]) -> Dict[str, Any]:
    if not seconds:
        return {"count": 0}
    ordered = sorted(seconds)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "count": len(ordered),
        "p50_ms": round(1000 * at(0.50), 1),
        "p99_ms": round(1000 * at(0.99), 1),
    }


def trained_counts(job_dir: str) -> Dict[str, Any]:
    """``kill_matrix``'s accounting (written, trained, lost, twice...) and the replies
    committed; nothing trained yet is zeros."""
    counts = serve_accounting(job_dir)
    if not trainer_lines(job_dir):
        return {**counts, "written": None, "trained": 0, "train_steps": 0}
    found = accounting(job_dir)
    return {**counts, **found, "trained": int(found["trained"])}


def settle(url: str, model: str, job_dir: str, args: Any, tally: Tally) -> Dict[str, Any]:
    """Top the committed replies up to whole train batches, then wait until the trainer has
    trained every one (or ``--settle-timeout``)."""
    began = time.monotonic()
    deadline = began + args.settle_timeout
    missing = -serve_accounting(job_dir)["replies_committed"] % args.batch
    topper, topped = Client(url, model, args.samples, tally, "topup"), 0
    while topped < missing and time.monotonic() < deadline:
        topped += args.samples if topper.episode() else 0
    counts = trained_counts(job_dir)
    while counts["trained"] < counts["replies_committed"] and time.monotonic() < deadline:
        time.sleep(0.5)
        counts = trained_counts(job_dir)
    return {"topped_up": topped, "settle_s": round(time.monotonic() - began, 1), **counts}


def load_phase(args: Any, run: Any, command: List[str], url: str, began: float) -> tuple:
    """Wait out ``--seconds`` of load, with a kill -9 and restart at ``--kill-at``, sampling
    the server's memory every 10 s; the run now serving, what the kill did, the samples."""
    port, kill, memory = int(url.rsplit(":", 1)[1]), None, []
    while time.monotonic() < began + args.seconds:
        at = time.monotonic() - began
        if kill is None and args.kill_at is not None and at >= args.kill_at:
            kill_group(run)
            run = start(command, None)
            wait_until_serving(url, run)
            kill = {"at_s": round(at, 1), "down_s": round(time.monotonic() - began - at, 1)}
            continue
        memory.append([round(at), server_rss_mb(run, port)])
        wake = min(began + args.seconds, time.monotonic() + 10.0)
        if kill is None and args.kill_at is not None:
            wake = min(wake, began + args.kill_at)
        time.sleep(max(0.0, wake - time.monotonic()))
    return run, kill, memory


def model_folder(name: str, root: str) -> str:
    """A model folder: ``name`` itself, or a tiny preset (micro, tiny, 25m) built here."""
    if os.path.isdir(name):
        return os.path.abspath(name)
    from trinity.demo.tiny import build_tiny_preset

    return build_tiny_preset(os.path.join(root, "model"), name)


def run_command(args: Any, model: str, root: str, port: int) -> List[str]:
    overrides = [f"checkpoint_root_dir={root}", f"model.model_path={model}", "name=serve_load"]
    overrides += [f"explorer.proxy_port={port}", "buffer.total_steps=1000000"]
    overrides += [f"buffer.train_batch_size={args.batch}", f"trainer.save_interval={args.save}"]
    command = [sys.executable, "-m", "trinity.cli.main", "run", "--config", SERVE_CONFIG]
    return command + overrides + list(args.overrides)


def measure(args: Any, root: str) -> Dict[str, Any]:
    """Start the run, load it, settle, stop it; the figures (see the module docstring)."""
    model, port = model_folder(args.model, root), free_port()
    url, job_dir = f"http://127.0.0.1:{port}", os.path.join(root, "quickstart", "serve_load")
    command = run_command(args, model, root, port)
    run = start(command, None)
    try:
        report: Dict[str, Any] = {"start_s": round(wait_until_serving(url, run), 1)}
        served = json.load(
            urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=_headers()))
        )
        name = served["data"][0]["id"]
        report.update(load_average_start=os.getloadavg(), rss_mb_start=server_rss_mb(run, port))
        tally, steps_before = Tally(), trainer_lines(job_dir)
        clients = [Client(url, name, args.samples, tally, f"c{i}") for i in range(args.clients)]
        began = time.monotonic()
        for client in clients:
            client.start()
        run, report["kill"], report["rss_mb_during"] = load_phase(args, run, command, url, began)
        tally.stop.set()
        for client in clients:
            client.join(120)
        tally.give_up.set()
        elapsed = time.monotonic() - began
        report.update(load_average_end=os.getloadavg(), rss_mb_end=server_rss_mb(run, port))
        report["train_steps_during_load"] = trainer_lines(job_dir) - steps_before
        report.update(traffic(tally, elapsed, sum(c.episodes for c in clients)))
        tally.give_up.clear()
        report.update(settle(url, name, job_dir, args, tally))
        report["errors"] = dict(tally.errors)  # the top-up's too
    finally:
        kill_group(run)
    return report


def traffic(tally: Tally, elapsed: float, episodes: int) -> Dict[str, Any]:
    """Requests per second, latencies and errors of the load phase."""
    done = sum(len(s) for s in tally.seconds.values())
    return {
        "load_s": round(elapsed, 1),
        "episodes": episodes,
        "requests": done,
        "requests_per_s": round(done / elapsed, 1),
        "latency": {kind: percentiles(s) for kind, s in tally.seconds.items()},
        "replies_committed_seen_by_clients": tally.committed,
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model folder, or micro/tiny/25m")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    parser.add_argument("--samples", type=int, default=4, help="replies per question")
    parser.add_argument("--batch", type=int, default=32, help="buffer.train_batch_size")
    parser.add_argument("--save", type=int, default=10, help="trainer.save_interval")
    parser.add_argument("--kill-at", type=float, default=None, help="kill -9 after S seconds")
    parser.add_argument("--settle-timeout", type=float, default=600.0)
    parser.add_argument("--overrides", nargs="*", default=[], help="more key=value overrides")
    parser.add_argument("--out", default="serve_load.json")
    args = parser.parse_args(argv)
    if args.batch % args.samples:
        parser.error("--batch must be a multiple of --samples (whole episodes per train step)")
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    report = {"benchmark": "serve_load", **settings, "cpus": os.cpu_count()}
    report.update(measure(args, tempfile.mkdtemp(prefix="trinity-serve-load-")))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: report[k] for k in SUMMARY if k in report}), flush=True)
    return report


SUMMARY = ("clients", "requests_per_s", "latency", "errors", "replies_committed", "written")
SUMMARY += ("trained", "lost", "twice", "rss_mb_start", "rss_mb_end", "load_average_start")


if __name__ == "__main__":
    main()
