"""The multi-turn learning checks (``learning_checks.py --only guess_number calculator
guess_number_gigpo``): each example's SFT warm-up then its RL stage on whole episodes, with
held-out success curves and a plot."""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from trinity.demo.calculator import prepare_calculator
from trinity.demo.guess_number import prepare_guess_number
from trinity.demo.synthetic import read_jsonl
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def curve(records: List[Dict[str, Any]], key: str) -> List[Tuple[int, float]]:
    """(step, value) of every record holding ``key``."""
    return [(r["step"], r[key]) for r in records if key in r]


def random_policy_success(rows: List[Dict[str, Any]]) -> float:
    """Expected success of uniform guesses inside the interval left, averaged over ``rows``."""

    @functools.cache
    def win(size: int, turns: int) -> float:
        # The secret is uniform among ``size`` numbers; a guess at position i leaves i below
        # and size - 1 - i above, each side reached with probability (its size) / size.
        if turns == 0 or size == 0:  # no guess left, or a side that cannot hold the secret
            return 0.0
        total = sum(
            1 + i * win(i, turns - 1) + (size - 1 - i) * win(size - 1 - i, turns - 1)
            for i in range(size)
        )
        return total / (size * size)

    return sum(win(r["high"] - r["low"] + 1, r["max_turns"]) for r in rows) / len(rows)


@dataclass(frozen=True)
class MultiTurnExample:
    """A multi-turn example: its config, plugins, data builder and held-out eval taskset."""

    config: str
    data_env: str  # the env var the config reads its data folder from
    prepare: Callable[..., Dict[str, str]]
    heldout: str  # the eval taskset's name
    what: str  # what the success rate counts
    plugin_dirs: Tuple[str, ...] = ()
    folder: str = ""  # its data and runs under TRINITY_CHECKPOINT_ROOT_DIR (default: its name)
    overrides: Tuple[str, ...] = ()  # a variant of the example: what it changes
    stage: str = "grpo"  # the RL stage's name, so a variant writes a run of its own


MULTI_TURN = {
    "guess_number": MultiTurnExample(
        os.path.join(ROOT, "examples", "guess_number", "guess_number.yaml"),
        "TRINITY_GUESS_NUMBER_DIR",
        prepare_guess_number,
        "guess_number_test",
        "held-out games (opening ranges never trained on) won within max_turns",
    ),
    # The RL stage renamed: the SFT stage's run is guess_number's, already finished.
    "guess_number_gigpo": MultiTurnExample(
        os.path.join(ROOT, "examples", "guess_number", "guess_number.yaml"),
        "TRINITY_GUESS_NUMBER_DIR",
        prepare_guess_number,
        "guess_number_test",
        "held-out games (opening ranges never trained on) won within max_turns",
        folder="guess_number",
        overrides=(
            "algorithm.algorithm_type=gigpo",
            "stages.0.algorithm.algorithm_type=sft",  # a global override reaches every stage
            "stages.1.stage_name=gigpo",
        ),
        stage="gigpo",
    ),
    "calculator": MultiTurnExample(
        os.path.join(ROOT, "examples", "calculator_agent", "calculator_agent.yaml"),
        "TRINITY_CALCULATOR_DIR",
        prepare_calculator,
        "calculator_test",
        "held-out questions (first factors never trained on) answered right",
        (os.path.join(ROOT, "examples", "calculator_agent"),),
    ),
}


def multi_turn_check(name: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Both stages (SFT warm-up, GRPO) of example ``name`` on fresh data; held-out curves."""
    example = MULTI_TURN[name]
    root = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], example.folder or name)
    shipped = inspect.signature(example.prepare).parameters
    preset = args.preset or shipped["preset"].default
    n_sft = args.n_sft or shipped["n_sft"].default
    paths = example.prepare(os.path.join(root, "data"), preset=preset, n_sft=n_sft)
    os.environ[example.data_env] = os.path.join(root, "data")
    overrides = [f"checkpoint_root_dir={root}", *example.overrides]
    if args.sft_epochs:
        overrides.append(f"stages.0.buffer.total_epochs={args.sft_epochs}")
    if args.steps:  # the GRPO stage's steps; a global total_steps would cut the SFT stage too
        interval = max(1, args.steps // 4)
        overrides += [f"stages.1.buffer.total_steps={args.steps}"]
        overrides += [f"explorer.eval_interval={interval}"]
    overrides += args.override
    start = time.monotonic()
    _, rl = run(example.config, overrides, list(example.plugin_dirs))
    explorer = read_metrics(os.path.join(rl.job_dir, "monitor", "explorer.jsonl"))
    eval_key = f"eval/{example.heldout}"
    heldout = curve(explorer, f"{eval_key}/accuracy/mean")
    result = {
        "metric": f"success rate: {example.what}, sampled at temperature 1, after the SFT "
        f"warm-up (step 0) and along the {example.stage} stage",
        "before": heldout[0][1],
        "after": heldout[-1][1],
        "heldout_success": heldout,
        "train_success": curve(explorer, "rollout/accuracy/mean"),
        "wall_seconds": round(time.monotonic() - start, 1),
        "settings": {"preset": preset, "n_sft": n_sft, "overrides": overrides},
    }
    for metric in ("turns", "tool_calls"):  # what the example's workflow reports
        if curve(explorer, f"{eval_key}/{metric}/mean"):
            result[f"heldout_{metric}"] = curve(explorer, f"{eval_key}/{metric}/mean")
    trainer = read_metrics(os.path.join(rl.job_dir, "monitor", "trainer.jsonl"))
    if curve(trainer, "gigpo/anchor_group_hit_ratio"):  # turns that share their state
        result["anchor_group_hit_ratio"] = curve(trainer, "gigpo/anchor_group_hit_ratio")
    if example.prepare is prepare_guess_number:
        test_rows = read_jsonl(os.path.join(paths["rl_path"], "test.jsonl"))
        result["random_policy_success"] = random_policy_success(test_rows)
    return result


def plot_multi_turn(name: str, result: Dict[str, Any], path: str) -> None:
    """The held-out and training success curves against GRPO step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (
        ("heldout_success", f"held-out (eval, {'greedy' if name == 'smollm2' else 'T=1'})", "o-"),
        ("train_success", "training rollouts", "-"),
    ):
        steps, values = zip(*result[key], strict=True)
        ax.plot(steps, values, style, label=label, alpha=1.0 if "o" in style else 0.5)
    if "random_policy_success" in result:
        chance = result["random_policy_success"]
        ax.axhline(chance, color="grey", lw=0.8, ls="--", label="random guess in the interval")
    ax.set_xlabel("GRPO step" + ("" if name == "smollm2" else " (after the SFT warm-up)"))
    ax.set_ylabel("accuracy" if name == "smollm2" else "success rate")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{name}, {result['settings']['preset']} model on CPU")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
