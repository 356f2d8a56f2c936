"""How soon ``trinity run`` takes its first step on the quickstart, and its peak memory, for
one or more checkouts of this repository side by side::

    git worktree add /tmp/before <commit>
    python bench/startup.py --checkouts before=/tmp/before,after=. --repeats 3 \\
        --out docs/results/startup.json

Each checkout runs the quickstart's own command (``trinity run --config
examples/quickstart/arithmetic.yaml``) as a subprocess, ``python -m trinity.cli.main`` with the
checkout first on ``PYTHONPATH``, on one quickstart folder built once, with short stages
(``--sft-steps``, ``--grpo-steps``). Runs alternate between checkouts (A B A B ...), so a
machine that drifts during the measurement weighs on each alike.

What is measured, from the moment the subprocess starts:
  * ``first_step_s``: to the end of the run's first training step (the first record of the
    first stage's ``trainer.jsonl``: its ``time`` is written when the step is done);
  * per stage, ``to_first_step_s``: from the previous stage's last record (the run's start
    for the first stage) to the stage's first trainer record, which for the GRPO stage
    includes its step-0 evaluation;
  * ``peak_memory``: ``PeakMemory`` of ``grpo_vs_trl.py`` over ``trinity run``'s process tree
    (PSS sums, Ray's processes included), sampled every ``--sample-s`` seconds;
  * ``wall_s``: the whole command.
Each round also runs ``first_step_floor.py`` (``floor``): the same first SFT step with plain
torch and transformers in a fresh process, timed the same way. It is what any one-process
trainer pays before its first step on this machine, mostly the two libraries' imports; the
difference between a checkout's ``first_step_s`` and the floor's is Trinity's own part.
It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

try:  # imported from the repository root (tests), or run as a script from bench/
    from bench.grpo_vs_trl import CONFIG, PeakMemory, trinity_run
except ImportError:
    from grpo_vs_trl import CONFIG, PeakMemory, trinity_run

STAGES = ("arithmetic_sft", "arithmetic_grpo")


def first_records(job_root: str) -> Dict[str, Dict[str, float]]:
    """Per stage: the time of its first and last trainer records."""
    out = {}
    for stage in STAGES:
        path = os.path.join(job_root, stage, "monitor", "trainer.jsonl")
        with open(path) as f:
            times = [json.loads(line)["time"] for line in f if line.strip()]
        out[stage] = {"first": min(times), "last": max(times)}
    return out


def one_run(checkout: str, quickstart: str, workdir: str, args: argparse.Namespace) -> Dict:
    """``trinity run`` on the quickstart from ``checkout``: its timings and peak memory."""
    root = tempfile.mkdtemp(prefix="ckpt-", dir=workdir)
    env = dict(os.environ, TRINITY_QUICKSTART_DIR=quickstart, TRINITY_CHECKPOINT_ROOT_DIR=root)
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(checkout), env.get("PYTHONPATH", "")])
    command = trinity_run(CONFIG, [f"stages.0.buffer.total_steps={args.sft_steps}"])
    command += [f"buffer.total_steps={args.grpo_steps}", "explorer.eval_interval=1000"]
    start = time.time()
    with tempfile.TemporaryFile() as output:
        # cwd too: ``python -m`` puts the working directory first on sys.path
        process = subprocess.Popen(
            command, env=env, cwd=checkout, stdout=output, stderr=subprocess.STDOUT
        )
        with PeakMemory(interval=args.sample_s, pid=process.pid) as memory:
            code = process.wait()
        wall = time.time() - start
        if code != 0:
            output.seek(0)
            raise RuntimeError(f"{checkout}: trinity run failed:\n{output.read().decode()}")
    marks = first_records(os.path.join(root, "quickstart"))
    stages, previous = {}, start
    for stage in STAGES:
        stages[stage] = {"to_first_step_s": marks[stage]["first"] - previous}
        previous = marks[stage]["last"]
    first = marks[STAGES[0]]["first"] - start
    return dict(first_step_s=first, stages=stages, wall_s=wall, peak_memory=memory.peak)


def floor_run(quickstart: str) -> Dict[str, float]:
    """``first_step_floor.py`` on the quickstart, in a fresh process: its timings."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_step_floor.py")
    start = time.time()
    done = subprocess.run(
        [sys.executable, script, quickstart, repr(start)], check=True, capture_output=True
    )
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def summarize(runs: List[Dict]) -> Dict:
    """Medians over a checkout's runs (and every run, for the record)."""

    def median(*keys: str) -> float:
        def value(run: Dict) -> float:
            for key in keys:
                run = run[key]
            return run

        return statistics.median(value(run) for run in runs)

    out = {"first_step_s": median("first_step_s"), "wall_s": median("wall_s")}
    out["peak_pss_mb"] = median("peak_memory", "pss_mb")
    out["peak_processes"] = median("peak_memory", "processes")
    for stage in STAGES:
        out[f"{stage}_to_first_step_s"] = median("stages", stage, "to_first_step_s")
    return dict(median=out, runs=runs)


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkouts", default="current=.", help="name=path,... of checkouts")
    parser.add_argument("--repeats", type=int, default=3, help="runs per checkout")
    parser.add_argument("--sft-steps", type=int, default=10, help="steps of the SFT stage")
    parser.add_argument("--grpo-steps", type=int, default=3, help="steps of the GRPO stage")
    parser.add_argument("--sample-s", type=float, default=1.0, help="memory sampling interval")
    parser.add_argument("--workdir", help="quickstart and checkpoints (default: a temp dir)")
    parser.add_argument("--out", default=os.path.join("docs", "results", "startup.json"))
    args = parser.parse_args(argv)
    pairs = (item.split("=", 1) for item in args.checkouts.split(","))
    args.checkouts = {name: os.path.abspath(path) for name, path in pairs}
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="startup-"))
    return args


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parse(argv)
    quickstart = os.path.join(args.workdir, "quickstart")
    # built by a subprocess: this process stays small, its memory counts in every sample
    build = [sys.executable, "-m", "trinity.cli.main", "prepare-quickstart", "--out", quickstart]
    subprocess.run(build, check=True, capture_output=True)
    runs: Dict[str, List[Dict]] = {name: [] for name in args.checkouts}
    floors: List[Dict[str, float]] = []
    for _ in range(args.repeats):
        floors.append(floor_run(quickstart))
        for name, path in args.checkouts.items():
            runs[name].append(one_run(path, quickstart, args.workdir, args))
    report = {"benchmark": "startup", "cpu_count": os.cpu_count()}
    report["settings"] = {k: getattr(args, k) for k in ("sft_steps", "grpo_steps", "repeats")}
    median = {key: statistics.median(f[key] for f in floors) for key in floors[0]}
    report["floor"] = dict(median=median, runs=floors)
    report["checkouts"] = {name: summarize(r) for name, r in runs.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print("floor", json.dumps(median))
    for name, result in report["checkouts"].items():
        print(name, json.dumps(result["median"]))
    return report


if __name__ == "__main__":
    main()
