"""kill -9 at random points, then the same command, for each ``synchronizer.sync_style``:
is every experience written trained on exactly once, or dropped as stale and counted?

For each style: ``trinity run`` of the small GRPO test config on the micro model (built here,
nothing downloaded; ``serve``: ``examples/serve/serve.yaml`` with ``examples/serve/client.py``
asking, rewarding and committing from a process of its own, killed and started again with
the run) is killed with SIGKILL (the whole process group: the driver and the Ray
it started) ``--kills`` times at random points (before start-up finished, mid-step, between
checkpoints), each time started again with the same command, then left to finish. From the
job's experience store and metrics::

    written   rows the explorer wrote (each explore step once)
    trained   experiences the final trainer history trained on (sample/experience_count)
    dropped   experiences dropped as stale (staleness/dropped, plus those read after the
              last train step, when only stale rows were left)
    lost      rows no train step read though a newer row was read (skipped)
    unread    rows newer than every row read: committed (serve) after the last train step
              took its batch; they stay in the store and a continued run reads them first
    twice     trained + dropped - written, when positive; steps logged twice

    python bench/kill_matrix.py --kills 5 --out docs/results/kill_matrix.json

It measures; it asserts nothing (``tests/reliability/test_faults.py`` asserts one kill per
style in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional

from trinity.trainer.distributed import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "integration", "configs", "grpo_small.yaml")
SERVE_CONFIG = os.path.join(ROOT, "examples", "serve", "serve.yaml")
CLIENT = os.path.join(ROOT, "examples", "serve", "client.py")
STYLES = ["fixed", "explorer_driven", "trainer_driven", "fully_async", "serve"]


def trainer_lines(job_dir: str) -> int:
    path = os.path.join(job_dir, "monitor", "trainer.jsonl")
    return len(open(path).readlines()) if os.path.exists(path) else 0


def kill_group(run: subprocess.Popen, timeout: float = 60) -> None:
    """SIGKILL the run and everything it started (its process group), until none is left;
    the run itself is reaped first (a zombie leader would still take the signal)."""
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except ProcessLookupError:  # it had finished, and nothing it started is left
        pass
    run.wait()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def start(command: List[str], client: Optional[List[str]]) -> subprocess.Popen:
    """The run, in a process group of its own; with ``client`` (serve), the client too,
    once the endpoint answers (it starts over after each kill, as a real one would)."""
    run = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    if client is not None:
        url = client[client.index("--url") + 1]
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        subprocess.Popen(client, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run


def killed_attempt(
    command: List[str], job_dir: str, rng: random.Random, target: int, client: Any = None
) -> str:
    """Start the run and SIGKILL it: ``target`` 0, 1-8 s after the start (start-up or the
    first steps); else once the trainer logged ``target`` steps, somewhere inside the next
    step. Returns where the kill landed."""
    run = start(command, client)
    if target == 0:
        time.sleep(rng.uniform(1.0, 8.0))
        where = "by time"
    else:
        deadline = time.monotonic() + 300
        while trainer_lines(job_dir) < target and run.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        where = f"after train step {trainer_lines(job_dir)}"
    finished = run.poll() == 0
    kill_group(run)
    return "finished before the kill" if finished else where


def buffer_db(job_dir: str) -> str:
    """The job's experience buffer database (named after the buffer)."""
    (name,) = [n for n in os.listdir(os.path.join(job_dir, "buffer")) if n.endswith(".db")]
    return os.path.join(job_dir, "buffer", name)


def experience_table(db: sqlite3.Connection) -> str:
    """The experience buffer's table: the one whose rows a train step marks consumed."""
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    columns = {n: {c[1] for c in db.execute(f"PRAGMA table_info({n})")} for n in names}
    (table,) = [n for n in names if "consumed_by" in columns[n]]
    return table


def serve_accounting(job_dir: str) -> Dict:
    """Serve: replies committed (to a step) against experiences written for them."""
    with sqlite3.connect(buffer_db(job_dir)) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        (responses,) = [t for t in tables if t.endswith("_responses")]
        committed = db.execute(
            f"SELECT COUNT(*) FROM {responses} WHERE committed_step IS NOT NULL"
        ).fetchone()[0]
        served = db.execute(f"SELECT COUNT(*) FROM {responses}").fetchone()[0]
    return {"replies_served": served, "replies_committed": committed}


def accounting(job_dir: str) -> Dict:
    """written / trained / dropped / lost / twice, from the store and the final metrics."""
    with open(os.path.join(job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    explorer = os.path.join(job_dir, "monitor", "explorer.jsonl")  # none in serve mode
    with open(explorer) if os.path.exists(explorer) else open(os.devnull) as f:
        explored = [json.loads(line)["step"] for line in f if "rollout/model_version" in line]
    steps = [r["step"] for r in trainer]
    last = max(steps)
    with sqlite3.connect(buffer_db(job_dir)) as db:
        table = experience_table(db)
        count = lambda where, *a: db.execute(  # noqa: E731
            f"SELECT COUNT(*) FROM {table} WHERE {where}", a
        ).fetchone()[0]
        newest_read = f"(SELECT MAX(id) FROM {table} WHERE consumed_by IS NOT NULL)"
        written, lost, unread, late = (
            count("1"),
            count(f"consumed_by IS NULL AND id < {newest_read}"),
            count(f"consumed_by IS NULL AND id > {newest_read}"),
            count("consumed_by > ?", last),
        )
    trained = sum(r["sample/experience_count"] for r in trainer)
    dropped = sum(r.get("staleness/dropped", 0) for r in trainer) + late
    return {
        "written": written,
        "trained": trained,
        "dropped_as_stale": dropped,
        "lost": lost,
        "unread": unread,
        "twice": max(0, trained + dropped - written),
        "train_steps_logged_twice": len(steps) - len(set(steps)),
        "explore_steps_logged_twice": len(explored) - len(set(explored)),
        "train_steps": last,
    }


def one_style(style: str, args: argparse.Namespace, model: str, data: str, root: str) -> Dict:
    rng = random.Random(f"{args.seed}-{style}")
    common = [f"checkpoint_root_dir={root}", f"model.model_path={model}"]
    common += [f"buffer.total_steps={args.steps}", "trainer.save_interval=2"]
    client = None
    if style == "serve":
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config, name = SERVE_CONFIG, "kill_serve"
        overrides = [*common, f"explorer.proxy_port={port}", "buffer.train_batch_size=16"]
        client = [sys.executable, CLIENT, "--url", url, "--samples", "4"]
        job_dir = os.path.join(root, "quickstart", name)
    else:
        config, name = CONFIG, f"kill_{style}"
        overrides = [*common, f"buffer.explorer_input.taskset.path={data}"]
        overrides += ["buffer.explorer_input.eval_tasksets=[]", f"synchronizer.sync_style={style}"]
        job_dir = os.path.join(root, "tests", name)
    command = [sys.executable, "-m", "trinity.cli.main", "run", "--config", config]
    command += [*overrides, f"name={name}"]
    # one kill by the clock, the others at distinct train steps spread over the run
    targets = [0] + sorted(rng.sample(range(1, args.steps), args.kills - 1))
    kills = [killed_attempt(command, job_dir, rng, target, client) for target in targets]
    began = time.monotonic()
    final = start(command, client)
    code = final.wait(timeout=900)
    result = {"style": style, "kills": kills, "final_returncode": code}
    result["final_run_s"] = time.monotonic() - began
    if code != 0:
        return result
    result.update(accounting(job_dir))
    if style == "serve":
        result.update(serve_accounting(job_dir))
    print(json.dumps({k: v for k, v in result.items() if k != "kills"}), flush=True)
    return result


def main(argv: List[str] | None = None) -> Dict:
    from trinity.demo.synthetic import make_arithmetic
    from trinity.demo.tiny import build_tiny_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5, help="kills per style")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--styles", default=",".join(STYLES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="kill_matrix.json")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="trinity-kill-")
    model = build_tiny_preset(os.path.join(root, "model"), "micro")
    data = os.path.join(root, "rl")
    make_arithmetic(data, n_train=64, n_test=16, digits=1, seed=0)
    styles = [one_style(s, args, model, data, root) for s in args.styles.split(",")]
    report = {"benchmark": "kill_matrix", "kills_per_style": args.kills, "steps": args.steps}
    report["styles"] = styles
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
