"""``concurrent_mode: multi-threading`` against ``asynchronous`` on a multi-turn workflow.

The same explore-only run (no trainer: explore steps are what the mode changes) once per
mode, side by side in one process; each task is one episode of a multi-turn workload:

- ``arithmetic3`` (default): three turns (``bench/plugins/multi_turn_arithmetic.py``: the
  question, then two follow-ups; the reward scores the last reply) on the quickstart's
  arithmetic data with the tiny model;
- ``guess_number``: the multi-turn example's game (``guess_number_workflow``, which defines
  ``run`` and ``run_async``) on its training games; give ``--model`` a warmed-up checkpoint
  (e.g. the example's SFT stage), as an untrained model's first reply usually ends the game.

::

    python bench/concurrency.py --out docs/results/concurrency.json
    python bench/concurrency.py --workload guess_number --model CKPT/hf --max-tokens 4

Each runner holds ``batch_size * repeat_times / runners`` episodes at once: threads of a
threaded actor in one mode, coroutines on an async actor's event loop in the other. Writes
JSON (per mode and round: every explore step's seconds, samples/s over the steps after the
first, which also pays the engine's warm-up, the run's wall time, and the exploring time the
engine was not generating, from its DEBUG batch log: the part the mode can change, less
skewed by other load on the machine than model compute) and prints a one-line summary with
the ratio. It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import tempfile
import time
from typing import Any, Dict, List

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGINS = os.path.join(ROOT, "bench", "plugins")
MODES = ("multi-threading", "asynchronous")
TURNS = 3  # arithmetic3 (bench/plugins/multi_turn_arithmetic.py): question and two follow-ups
# TransformersInferenceModel's DEBUG line for each batch it generated
BATCH_LINE = re.compile(r"generated \d+ request\(s\), \d+ row\(s\) in ([\d.]+)s")


# workload -> (workflow, taskset format)
WORKLOADS = {
    "arithmetic3": ("multi_turn_arithmetic", {"prompt_key": "question", "response_key": "answer"}),
    "guess_number": ("guess_number_workflow", {}),
}


def prepare(args: argparse.Namespace, workdir: str) -> Dict[str, str]:
    """The model and the workload's taskset: given, or built as the demos build them."""
    from trinity.demo.tiny import build_tiny_preset

    data = args.data
    if args.workload == "guess_number" and data is None:
        from trinity.demo.guess_number import prepare_guess_number

        built = prepare_guess_number(os.path.join(workdir, "guess_number"), preset=args.preset)
        data = built["rl_path"]
    elif data is None:
        from trinity.demo.synthetic import make_arithmetic

        data = os.path.join(workdir, "data", "rl")
        make_arithmetic(data, n_train=args.batch_size * args.steps, n_test=16, digits=2, seed=0)
    model = args.model or build_tiny_preset(os.path.join(workdir, "model"), args.preset)
    return {"model": os.path.abspath(model), "data": os.path.abspath(data)}


def write_config(args: argparse.Namespace, paths: Dict[str, str], mode: str, tag: str) -> str:
    """An explore-mode config for ``mode`` (tasks of one episode each, no eval)."""
    config = {
        "project": "bench",
        "name": f"concurrency_{tag}",
        "mode": "explore",
        "checkpoint_root_dir": os.path.join(args.workdir, "checkpoints"),
        # a three-turn conversation of a character-level model: a few hundred tokens
        "model": {
            "model_path": paths["model"],
            "max_prompt_tokens": 256,
            "max_response_tokens": args.max_tokens,
        },
        "algorithm": {"algorithm_type": "grpo", "repeat_times": args.repeat_times},
        "buffer": {
            "batch_size": args.batch_size,
            "total_steps": args.steps,
            "explorer_input": {
                "default_workflow_type": WORKLOADS[args.workload][0],
                "taskset": {
                    "name": f"{args.workload}_train",
                    "storage_type": "file",
                    "path": paths["data"],
                    "split": "train",
                    "format": WORKLOADS[args.workload][1],
                    "rollout_args": {"temperature": 1.0},
                },
            },
            "trainer_input": {
                "experience_buffer": {
                    "name": f"episodes_{tag}",
                    "storage_type": "queue",
                    "path": f"sqlite:///{os.path.join(args.workdir, f'{tag}.db')}",
                }
            },
        },
        "explorer": {
            "runner_per_model": args.runners,
            "concurrent_mode": mode,
            "max_repeat_times_per_runner": 1,  # a task is one episode
            "eval_on_startup": False,
            # guess_number_workflow builds each episode from the recorded calls
            "rollout_model": {"enable_history": args.workload == "guess_number"},
        },
        "monitor": {"monitor_type": "tensorboard"},
        # the engine logs each batch it generates at DEBUG: engine_busy_s below
        "log": {"level": "DEBUG"},
    }
    path = os.path.join(args.workdir, f"{tag}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def engine_busy(job_dir: str) -> float:
    """Seconds the run's engines spent generating (their logged batches, summed)."""
    busy = 0.0
    for name in glob.glob(os.path.join(job_dir, "log", "*_engine_*.log")):
        with open(name) as f:
            busy += sum(float(m.group(1)) for m in map(BATCH_LINE.search, f) if m)
    return busy


def timed_run(args: argparse.Namespace, paths: Dict[str, str], mode: str, round_: int) -> Dict:
    """One explore-mode run of ``mode``: its steps' seconds and samples/s."""
    from trinity.monitor import read_metrics
    from trinity.runtime.launcher import run

    tag = f"{mode.replace('-', '_')}_{round_}"
    config = write_config(args, paths, mode, tag)
    start, load = time.monotonic(), os.getloadavg()[0]
    (result,) = run(config, [], [PLUGINS])
    wall = time.monotonic() - start
    records = read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
    steps = [r for r in records if "time/explore_step" in r]
    seconds = [r["time/explore_step"] for r in steps]
    samples = args.batch_size * args.repeat_times
    steady = seconds[1:] or seconds
    busy = engine_busy(result.job_dir)
    turns = [r["rollout/turns/mean"] for r in steps if "rollout/turns/mean" in r]
    turns_mean = statistics.fmean(turns) if turns else TURNS
    return {
        "mode": mode,
        "round": round_,
        "wall_s": wall,
        "explore_step_s": seconds,
        "explore_s_total": sum(seconds),
        "tasks_failed": sum(r.get("rollout/tasks_failed", 0.0) for r in steps),
        "reward_mean": statistics.fmean(r.get("rollout/reward/mean", 0.0) for r in steps),
        "samples_per_s": samples * len(steady) / sum(steady),
        "turns_mean": turns_mean,
        "model_calls_per_s": samples * turns_mean * len(steady) / sum(steady),
        # what the mode can change: exploring time the engine was not generating (runners,
        # transport, batching windows); the rest is model compute, which other load skews
        "engine_busy_s": busy,
        "not_generating_s_per_step": (sum(seconds) - busy) / len(seconds),
        # the machine's 1-minute load average before and after: other work skews a run
        "load_avg": [load, os.getloadavg()[0]],
    }


def summarize(runs: List[Dict], args: argparse.Namespace) -> Dict[str, Any]:
    """Per mode, the median over rounds of samples/s, exploring seconds and seconds per step
    the engine was not generating; and the median over rounds of the samples/s ratio."""
    by_mode = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        by_mode[mode] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("samples_per_s", "explore_s_total", "not_generating_s_per_step")
        }
    # Each round's two runs ran back to back: their ratio is the least skewed by load drift.
    ratios = [
        a["samples_per_s"] / t["samples_per_s"] for t, a in zip(runs[0::2], runs[1::2], strict=True)
    ]
    ratio = statistics.median(ratios)
    episodes = args.batch_size * args.repeat_times
    summary = (
        f"concurrency ({args.workload}: {statistics.fmean(r['turns_mean'] for r in runs):.1f}-turn "
        f"episodes, {episodes} per step over {args.runners} runners, "
        f"{args.steps} steps, {args.rounds} round(s)): "
        + ", ".join(
            f"{mode} {m['samples_per_s']:.1f} samples/s ({m['explore_s_total']:.1f}s exploring, "
            f"{m['not_generating_s_per_step']:.2f}s/step not generating)"
            for mode, m in by_mode.items()
        )
        + f": asynchronous/multi-threading {ratio:.2f}x (median of the rounds' ratios)"
    )
    return {"modes": by_mode, "round_ratios": ratios, "ratio": ratio, "summary": summary}


def main(argv: List[str] | None = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="arithmetic3")
    parser.add_argument("--model", help="a model folder (default: build the tiny preset)")
    parser.add_argument("--preset", default="tiny", help="tiny preset built without --model")
    parser.add_argument("--data", help="the workload's taskset folder (default: generate one)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeat-times", type=int, default=8)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternated")
    parser.add_argument("--workdir", help="where runs write (default: a temporary folder)")
    parser.add_argument("--out", default="concurrency.json")
    args = parser.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="trinity-conc-"))
    os.makedirs(args.workdir, exist_ok=True)
    paths = prepare(args, args.workdir)
    # One Ray for all runs (a fresh one each would cost more than a run's steps), and the
    # modes alternated (threads, async, threads, ...): a drift in the machine's load, or
    # warm Ray workers, favour neither.
    import ray

    from trinity.runtime.launcher import init_ray

    ray_was_up = ray.is_initialized()
    init_ray("bench_concurrency")
    try:
        runs = [timed_run(args, paths, mode, r) for r in range(args.rounds) for mode in MODES]
    finally:
        if not ray_was_up:
            ray.shutdown()
    report = {"benchmark": "concurrency", "setup": vars(args), "runs": runs}
    report.update(summarize(runs, args))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
