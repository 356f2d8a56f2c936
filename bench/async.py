"""The same GRPO run under several weight-sync schedules: wall time, samples/s and accuracy.

Sides (``--sides``, in this order, one run each from the same SFT checkpoint):

- ``fixed``: ``sync_offset: 0``, strictly on-policy (explorer and trainer alternate);
- ``fixed_offset1``: the explorer one step ahead with one-step-old weights (they overlap);
- ``explorer_driven``: the explorer never waits; every ``sync_interval`` steps it asks the
  trainer for fresh weights and loads them at a later step boundary;
- ``trainer_driven``: the explorer never waits; the trainer publishes every
  ``sync_interval`` steps and the explorer loads the newest at each step boundary;
- ``fully_async``: as trainer_driven, and explore steps overlap: no runner waits for a
  step's slowest task.

``--workload delayed`` swaps the quickstart's workflow for episodes whose environment answers
after 0.1-2 s (``bench/plugins/delayed_tool.py``), where a step's slowest task decides how
long a step-by-step explorer waits. Each side's trainer records give the
staleness distribution (``synchronizer.max_staleness``: what was dropped).

::

    python bench/async.py --sft-checkpoint CKPT/hf --data ./quickstart --steps 60 --out async.json

Writes JSON (for each side: the training loop's wall seconds, startup and eval excluded as
``grpo_vs_trl.py`` counts them, the whole run's without eval, samples explored per second of
the loop, the held-out accuracy curve, the model version each explore step used) and prints
a one-line summary with each side's loop speed-up over the first. It measures; it asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Dict, List

import yaml

from trinity.monitor import read_metrics

try:  # imported from the repository root (tests), or run as a script from bench/
    from bench.grpo_vs_trl import launch, trinity_timeline
except ImportError:
    from grpo_vs_trl import launch, trinity_timeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
METRIC = "eval/arithmetic_test/accuracy/mean"
SIDES = {
    "fixed": ["synchronizer.sync_style=fixed", "synchronizer.sync_offset=0"],
    "fixed_offset1": ["synchronizer.sync_style=fixed", "synchronizer.sync_offset=1"],
    "explorer_driven": ["synchronizer.sync_style=explorer_driven", "synchronizer.sync_offset=0"],
    "trainer_driven": ["synchronizer.sync_style=trainer_driven", "synchronizer.sync_offset=0"],
    "fully_async": ["synchronizer.sync_style=fully_async", "synchronizer.sync_offset=0"],
}
PLUGINS = os.path.join(ROOT, "bench", "plugins")
WORKLOADS = {
    "quickstart": [],
    "delayed": [
        "buffer.explorer_input.default_workflow_type=delayed_tool_arithmetic",
        "buffer.explorer_input.default_eval_workflow_type=math_workflow",  # held-out: no delay
    ],
}


def one_stage_config(workdir: str) -> str:
    """The quickstart config without its stages (the GRPO settings alone)."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(workdir, "grpo.yaml")
    with open(path, "w") as f:
        f.write(text[: text.index("stages:")])
    return path


def _samples_per_step(job_dir: str) -> int:
    """Experiences one explore step makes: batch_size x repeat_times of the saved config."""
    with open(os.path.join(job_dir, "config.yaml")) as f:
        saved = yaml.safe_load(f)
    return saved["buffer"]["batch_size"] * saved["algorithm"]["repeat_times"]


def timed_run(config: str, side: str, label: str, args: argparse.Namespace) -> Dict:
    overrides = [
        f"name=sync_{label}",
        f"model.model_path={os.path.abspath(args.sft_checkpoint)}",
        f"synchronizer.sync_interval={args.sync_interval}",
        f"buffer.total_steps={args.steps}",
        f"explorer.eval_interval={args.eval_interval}",
        f"explorer.eval_on_startup={str(args.startup_eval).lower()}",
        *WORKLOADS[args.workload],
        *SIDES[side],
    ]
    # Each run is a `trinity run` process of its own: a later one inherits nothing warm.
    run_start = time.time()
    job_dir, _, wall = launch(config, overrides, [PLUGINS])
    explorer = read_metrics(os.path.join(job_dir, "monitor", "explorer.jsonl"))
    trainer = read_metrics(os.path.join(job_dir, "monitor", "trainer.jsonl"))
    timeline = trinity_timeline(explorer, trainer, run_start, METRIC)
    curve: List = [(r["step"], r[METRIC]) for r in explorer if METRIC in r]
    eval_seconds = sum(r.get("time/eval", 0.0) for r in explorer)
    steps = [r for r in explorer if "rollout/model_version" in r]
    versions = [int(r["rollout/model_version"]) for r in steps]
    samples = len(steps) * _samples_per_step(job_dir)
    return {
        "side": label,
        "overrides": SIDES[side],
        "wall_s": wall,
        "wall_s_without_eval": wall - eval_seconds,
        "startup_s": timeline["startup_s"],
        "loop_s": timeline["loop_s"],
        "samples": samples,
        "samples_per_s": samples / timeline["loop_s"],
        "accuracy": curve,
        "final_accuracy": curve[-1][1] if curve else None,
        "model_versions": versions,
        # updates the weights of explore step s lacked: s - 1 - version (0 = on-policy)
        "mean_staleness": sum(r["step"] - 1 - v for r, v in zip(steps, versions, strict=True))
        / max(1, len(steps)),
        "train_steps": max((r["step"] for r in trainer), default=0),
        # explored samples the trainer trained on (the rest were dropped as stale)
        "trained_samples": sum(r.get("sample/experience_count", 0) for r in trainer),
        "trained_samples_per_s": sum(r.get("sample/experience_count", 0) for r in trainer)
        / timeline["loop_s"],
        "time_to_target_s": next(
            (t for _, _, t, acc in timeline["curve"] if acc >= args.target), None
        ),
        "staleness": staleness_figures(trainer),
    }


def staleness_figures(trainer: List[Dict]) -> Dict:
    """The trainer's ``staleness/*`` records: how many steps trained at each maximum age,
    the mean age and what was dropped as stale."""
    steps = [r for r in trainer if "staleness/dropped" in r]
    ages = [int(r["staleness/max"]) for r in steps if "staleness/max" in r]
    means = [r["staleness/mean"] for r in steps if "staleness/mean" in r]
    return {
        "steps_by_max_staleness": {str(a): ages.count(a) for a in sorted(set(ages))},
        "mean": sum(means) / len(means) if means else None,
        "dropped": sum(r["staleness/dropped"] for r in steps),
    }


def summarize(runs: List[Dict], steps: int) -> Dict:
    """Loop speed-ups over the first side, and the one-line summary."""
    base = runs[0]
    speedup = {r["side"]: base["loop_s"] / r["loop_s"] for r in runs}
    run_speedup = {r["side"]: base["wall_s_without_eval"] / r["wall_s_without_eval"] for r in runs}
    summary = f"async {steps} steps: " + ", ".join(
        f"{r['side']} loop {r['loop_s']:.1f}s {r['samples_per_s']:.0f} samples/s "
        f"(whole run {r['wall_s_without_eval']:.1f}s, acc {r['final_accuracy']}, "
        f"staleness {r['mean_staleness']:.2f}, {speedup[r['side']]:.2f}x)"
        for r in runs
    )
    return {"speedup": speedup, "run_speedup": run_speedup, "summary": summary}


def main(argv: List[str] | None = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the quickstart folder")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--sync-interval", type=int, default=1)
    parser.add_argument(
        "--startup-eval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate the starting weights too (--no-startup-eval: the final weights only)",
    )
    parser.add_argument(
        "--sides",
        default="fixed,explorer_driven,trainer_driven",
        help=f"comma-separated, the first is the baseline (a repeated side runs again); "
        f"of: {', '.join(SIDES)}",
    )
    parser.add_argument("--workload", default="quickstart", choices=sorted(WORKLOADS))
    parser.add_argument("--target", type=float, default=0.7, help="accuracy for time-to-target")
    parser.add_argument("--out", default="async.json")
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)} (known: {', '.join(SIDES)})")
    workdir = tempfile.mkdtemp(prefix="trinity-async-")
    os.environ["TRINITY_QUICKSTART_DIR"] = os.path.abspath(args.data)
    os.environ["TRINITY_CHECKPOINT_ROOT_DIR"] = workdir
    config = one_stage_config(workdir)
    # A side named twice (e.g. fixed first and last, to see the machine's drift) runs twice.
    labels = [
        s if s not in sides[:i] else f"{s}_{sides[:i].count(s) + 1}" for i, s in enumerate(sides)
    ]
    runs = [timed_run(config, side, label, args) for side, label in zip(sides, labels, strict=True)]
    report = {"benchmark": "async", "steps": args.steps, "sync_interval": args.sync_interval}
    report.update(workload=args.workload, target=args.target)
    report.update(runs=runs, **summarize(runs, args.steps))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
