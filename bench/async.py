"""The same GRPO run with ``sync_offset: 0`` and ``sync_offset: 1``: wall time and accuracy.

With offset 0 the explorer waits for every update (strictly on-policy: explorer and trainer
alternate); with offset 1 it explores the next step with one-step-old weights while the
trainer trains, so the two overlap. Both runs start from the same SFT checkpoint::

    python bench/async.py --sft-checkpoint CKPT/hf --data ./quickstart --steps 60 --out async.json

Writes JSON (wall seconds, seconds per step, the held-out accuracy curve of each run) and
prints a one-line summary with the speed-up. It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Dict, List

from trinity.monitor import read_metrics
from trinity.runtime.launcher import run

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
    start = time.monotonic()
    (result,) = run(config, overrides, [])
    wall = time.monotonic() - start
    explorer = read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
    curve: List = [(r["step"], r[METRIC]) for r in explorer if METRIC in r]
    eval_seconds = sum(r.get("time/eval", 0.0) for r in explorer)
    return {
        "sync_offset": offset,
        "wall_s": wall,
        "wall_s_without_eval": wall - eval_seconds,
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
    speedup = runs[0]["wall_s_without_eval"] / runs[1]["wall_s_without_eval"]
    summary = (
        f"async {args.steps} steps: sync_offset 0 {runs[0]['wall_s_without_eval']:.1f}s "
        f"(acc {runs[0]['final_accuracy']}), sync_offset 1 {runs[1]['wall_s_without_eval']:.1f}s "
        f"(acc {runs[1]['final_accuracy']}): {speedup:.2f}x"
    )
    report = {"benchmark": "async", "runs": runs, "speedup": speedup, "summary": summary}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(summary)
    return report


if __name__ == "__main__":
    main()
