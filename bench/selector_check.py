"""Task selectors on the quickstart (``learning_checks.py --only selectors``): GRPO from the
same SFT warm-up with each selector and each of ``--seeds`` (the selector's and the rollout
engine's sampling seed), and the steps and seconds each run takes to reach a held-out greedy
accuracy target (the step-0 accuracy plus ``--target-gain``), evaluated every
``--eval-every`` steps. Held-out accuracy is over 200 questions, so a run's curve moves by a
few points from one eval to the next by chance: compare medians over seeds.

Arms (``--selectors``):

- ``shuffle``: the baseline, a new permutation each epoch.
- ``diff_based``: adaptive from the start; a task never explored counts as a 0.5 success
  rate, so it mostly draws new tasks and comes back to those near 0.5.
- ``diff_based_prior``: the same with a prior per task from a prior run: the SFT model
  explores every training task ``--prior-samples`` times at temperature 1 without training
  (``mode: explore``), and each task's mean reward there becomes the ``prior_accuracy``
  column ``feature_keys`` names. The prior run's seconds are reported apart.
- ``offline_easy2hard``: that prior column, highest accuracy first.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional

from trinity.demo.synthetic import read_jsonl, write_jsonl
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run

SELECTORS = ("shuffle", "diff_based", "diff_based_prior", "offline_easy2hard")
TASKSET = "buffer.explorer_input.taskset"
HELDOUT = "eval/arithmetic_test/accuracy/mean"
PRIOR = "prior_accuracy"


def prior_run(config: str, ckpt: str, rl_dir: str, samples: int, out_dir: str) -> float:
    """Explore every training task ``samples`` times with the SFT model (no training) and
    write the training rows with their mean reward as ``prior_accuracy`` to ``out_dir``;
    returns the run's seconds."""
    start = time.monotonic()
    overrides = [
        "name=selector_prior",
        "mode=explore",
        f"model.model_path={ckpt}",
        f"algorithm.repeat_times={samples}",
        "buffer.batch_size=200",
        "buffer.total_steps=10",  # 2000 tasks once
        "buffer.explorer_input.eval_tasksets=[]",
        "explorer.eval_on_startup=false",
    ]
    (result,) = run(config, overrides, [])
    rewards = task_rewards(os.path.join(result.job_dir, "buffer", "arithmetic_buffer.db"))
    rows = read_jsonl(os.path.join(rl_dir, "train.jsonl"))
    missing = [i for i in range(len(rows)) if i not in rewards]
    if missing:
        raise RuntimeError(f"the prior run left {len(missing)} tasks unexplored, e.g. {missing[0]}")
    for index, row in enumerate(rows):
        row[PRIOR] = rewards[index]
    write_jsonl(os.path.join(out_dir, "train.jsonl"), rows)
    return time.monotonic() - start


def task_rewards(database: str, table: str = "arithmetic_buffer") -> Dict[int, float]:
    """Row -> mean reward of its experiences (group id ``train-<step>-<taskset>-<row>``)."""
    sums: Dict[int, List[float]] = defaultdict(list)
    with sqlite3.connect(database) as conn:
        for group, reward in conn.execute(f"SELECT group_id, reward FROM {table}"):
            sums[int(group.rsplit("-", 1)[1])].append(min(1.0, max(0.0, reward or 0.0)))
    return {row: sum(values) / len(values) for row, values in sums.items()}


def selector_overrides(selector: str, seed: int, prior_dir: Optional[str]) -> List[str]:
    """The taskset overrides of arm ``selector``."""
    if selector in ("shuffle", "diff_based"):
        return [f"{TASKSET}.task_selector={{selector_type: {selector}, seed: {seed}}}"]
    kind = "diff_based" if selector == "diff_based_prior" else selector
    return [
        f"{TASKSET}.path={prior_dir}",
        f"{TASKSET}.task_selector={{selector_type: {kind}, seed: {seed}, feature_keys: [{PRIOR}]}}",
    ]


def time_to_target(records: List[Dict[str, Any]], target: float) -> Dict[str, Any]:
    """The held-out curve, and the first eval at or above ``target``: its step and the
    seconds since the step-0 eval (None when never reached)."""
    evals = [(r["step"], r[HELDOUT], r["time"]) for r in records if HELDOUT in r]
    start = evals[0][2]
    reached = next(((s, t - start) for s, a, t in evals if a >= target), (None, None))
    return {
        "heldout_accuracy": [(s, a) for s, a, _ in evals],
        "steps_to_target": reached[0],
        "seconds_to_target": None if reached[1] is None else round(reached[1], 1),
    }


def arm_run(config: str, ckpt: str, steps: int, arm: str, seed: int, args: Any, prior: Any) -> Any:
    """One GRPO run of arm ``arm`` with ``seed`` (the selector's and the engine's sampling);
    its explorer records and overrides."""
    overrides = [
        f"name=selector_{arm}_seed{seed}",
        f"model.model_path={ckpt}",
        f"buffer.total_steps={steps}",
        f"explorer.eval_interval={args.eval_every}",
        f"explorer.rollout_model.seed={seed}",
        *selector_overrides(arm, seed, prior),
    ]
    (result,) = run(config, overrides, [])
    return read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl")), overrides


def selector_checks(
    config: str, ckpt: str, data: str, steps: int, args: Any
) -> Dict[str, Dict[str, Any]]:
    """Every arm of ``args.selectors`` with every seed of ``args.seeds`` from checkpoint
    ``ckpt``: per arm the runs and the median steps to the target; the prior run's time."""
    results: Dict[str, Dict[str, Any]] = {}
    prior: Optional[str] = None
    if any(s in ("diff_based_prior", "offline_easy2hard") for s in args.selectors):
        prior = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "prior_data")
        rl_dir = os.path.join(data, "data", "rl")
        seconds = prior_run(config, ckpt, rl_dir, args.prior_samples, prior)
        results["prior"] = {"seconds": round(seconds, 1), "samples_per_task": args.prior_samples}
    target: Optional[float] = None
    for arm in args.selectors:
        runs = {}
        for seed in args.seeds:
            records, overrides = arm_run(config, ckpt, steps, arm, seed, args, prior)
            if target is None:  # every run starts from the same weights: one step-0 accuracy
                target = next(r[HELDOUT] for r in records if HELDOUT in r) + args.target_gain
            runs[seed] = {**time_to_target(records, target), "overrides": overrides}
        reached = [r["steps_to_target"] for r in runs.values()]
        # a run that never reached the target counts as beyond the last step
        ranked = sorted(steps + 1 if s is None else s for s in reached)
        results[arm] = {
            "target": target,
            "steps_to_target": reached,
            "median_steps_to_target": statistics.median(ranked),
            "seconds_to_target": [r["seconds_to_target"] for r in runs.values()],
            "final_accuracy": [r["heldout_accuracy"][-1][1] for r in runs.values()],
            "runs": runs,
        }
    return results
