"""The same GRPO run with ``sync_offset: 0`` and ``sync_offset: 1``: wall time and accuracy.

With offset 0 the explorer waits for every update (strictly on-policy: explorer and trainer
alternate); with offset 1 it explores the next step with one-step-old weights while the
trainer trains, so the two overlap. Both runs start from the same SFT checkpoint::

    python bench/async.py --sft-checkpoint CKPT/hf --data ./quickstart --steps 60 --out async.json

Writes JSON (for each run: the training loop's wall seconds, startup and eval excluded as
``grpo_vs_trl.py`` counts them, the whole run's without eval, the held-out accuracy curve)
and prints a one-line summary with the loop's speed-up (and the whole runs'). It measures;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Dict, List

from trinity.monitor import read_metrics

try:  # imported from the repository root (tests), or run as a script from bench/
    from bench.grpo_vs_trl import launch, trinity_timeline
except ImportError:
    from grpo_vs_trl import launch, trinity_timeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
METRIC = "eval/arithmetic_test/accuracy/mean"


def one_stage_config(workdir: str) -> str:
    """The quickstart config without its stages (the GRPO settings alone)."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(workdir, "grpo.yaml")
    with open(path, "w") as f:
        f.write(text[: text.index("stages:")])
    return path


def timed_run(config: str, offset: int, args: argparse.Namespace) -> Dict:
    overrides = [
        f"name=sync_offset_{offset}",
        f"model.model_path={os.path.abspath(args.sft_checkpoint)}",
        f"synchronizer.sync_offset={offset}",
        f"buffer.total_steps={args.steps}",
        f"explorer.eval_interval={args.eval_interval}",
    ]
    # Each run starts (and stops) its own Ray, so the second does not inherit a warm one.
    run_start = time.time()
    result, wall = launch(config, overrides)
    explorer = read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
    trainer = read_metrics(os.path.join(result.job_dir, "monitor", "trainer.jsonl"))
    timeline = trinity_timeline(explorer, trainer, run_start)
    curve: List = [(r["step"], r[METRIC]) for r in explorer if METRIC in r]
    eval_seconds = sum(r.get("time/eval", 0.0) for r in explorer)
    return {
        "sync_offset": offset,
        "wall_s": wall,
        "wall_s_without_eval": wall - eval_seconds,
        "startup_s": timeline["startup_s"],
        "loop_s": timeline["loop_s"],
        "accuracy": curve,
        "final_accuracy": curve[-1][1] if curve else None,
    }


def main(argv: List[str] | None = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the quickstart folder")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--out", default="async.json")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="trinity-async-")
    os.environ["TRINITY_QUICKSTART_DIR"] = os.path.abspath(args.data)
    os.environ["TRINITY_CHECKPOINT_ROOT_DIR"] = workdir
    config = one_stage_config(workdir)
    runs = [timed_run(config, offset, args) for offset in (0, 1)]
    # The speed-up is the training loop's: startup does not depend on sync_offset, and the
    # first run of a process also pays the imports the second finds done.
    speedup = runs[0]["loop_s"] / runs[1]["loop_s"]
    run_speedup = runs[0]["wall_s_without_eval"] / runs[1]["wall_s_without_eval"]
    summary = f"async {args.steps} steps: " + ", ".join(
        f"sync_offset {r['sync_offset']} loop {r['loop_s']:.1f}s "
        f"(whole run {r['wall_s_without_eval']:.1f}s, acc {r['final_accuracy']})"
        for r in runs
    )
    summary += f": {speedup:.2f}x loop ({run_speedup:.2f}x whole runs)"
    report = {"benchmark": "async", "runs": runs, "speedup": speedup}
    report.update(run_speedup=run_speedup, summary=summary)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(summary)
    return report


if __name__ == "__main__":
    main()
