"""kill -9 at random points, then the same command, for each ``synchronizer.sync_style``:
is every experience written trained on exactly once, or dropped as stale and counted?

For each style: ``trinity run`` of the small GRPO test config on the micro model (built here,
nothing downloaded) is killed with SIGKILL (the whole process group: the driver and the Ray
it started) ``--kills`` times at random points (before start-up finished, mid-step, between
checkpoints), each time started again with the same command, then left to finish. From the
job's experience store and metrics::

    written   rows the explorer wrote (each explore step once)
    trained   experiences the final trainer history trained on (sample/experience_count)
    dropped   experiences dropped as stale (staleness/dropped, plus those read after the
              last train step, when only stale rows were left)
    lost      rows no train step read (consumed_by is null)
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
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "integration", "configs", "grpo_small.yaml")
STYLES = ["fixed", "explorer_driven", "trainer_driven", "fully_async"]


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


def killed_attempt(command: List[str], job_dir: str, rng: random.Random, target: int) -> str:
    """Start the run and SIGKILL it: ``target`` 0, 1-8 s after the start (start-up or the
    first steps); else once the trainer logged ``target`` steps, somewhere inside the next
    step. Returns where the kill landed."""
    run = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
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


def accounting(job_dir: str) -> Dict:
    """written / trained / dropped / lost / twice, from the store and the final metrics."""
    with open(os.path.join(job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    with open(os.path.join(job_dir, "monitor", "explorer.jsonl")) as f:
        explored = [json.loads(line)["step"] for line in f if "rollout/model_version" in line]
    steps = [r["step"] for r in trainer]
    last = max(steps)
    with sqlite3.connect(os.path.join(job_dir, "buffer", "experience_buffer.db")) as db:
        count = lambda where, *a: db.execute(  # noqa: E731
            f"SELECT COUNT(*) FROM experience_buffer WHERE {where}", a
        ).fetchone()[0]
        written, lost, late = (
            count("1"),
            count("consumed_by IS NULL"),
            count("consumed_by > ?", last),
        )
    trained = sum(r["sample/experience_count"] for r in trainer)
    dropped = sum(r.get("staleness/dropped", 0) for r in trainer) + late
    return {
        "written": written,
        "trained": trained,
        "dropped_as_stale": dropped,
        "lost": lost,
        "twice": max(0, trained + dropped - written),
        "train_steps_logged_twice": len(steps) - len(set(steps)),
        "explore_steps_logged_twice": len(explored) - len(set(explored)),
        "train_steps": last,
    }


def one_style(style: str, args: argparse.Namespace, model: str, data: str, root: str) -> Dict:
    rng = random.Random(f"{args.seed}-{style}")
    overrides = [
        f"checkpoint_root_dir={root}",
        f"name=kill_{style}",
        f"model.model_path={model}",
        f"buffer.explorer_input.taskset.path={data}",
        "buffer.explorer_input.eval_tasksets=[]",
        f"buffer.total_steps={args.steps}",
        "trainer.save_interval=2",
        f"synchronizer.sync_style={style}",
    ]
    command = [sys.executable, "-m", "trinity.cli.main", "run", "--config", CONFIG, *overrides]
    job_dir = os.path.join(root, "tests", f"kill_{style}")
    # one kill by the clock, the others at distinct train steps spread over the run
    targets = [0] + sorted(rng.sample(range(1, args.steps), args.kills - 1))
    kills = [killed_attempt(command, job_dir, rng, target) for target in targets]
    start = time.monotonic()
    final = subprocess.run(command, capture_output=True, text=True, timeout=900)
    result = {"style": style, "kills": kills, "final_returncode": final.returncode}
    result["final_run_s"] = time.monotonic() - start
    if final.returncode != 0:
        result["final_output"] = (final.stdout + final.stderr)[-2000:]
        return result
    result.update(accounting(job_dir))
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
