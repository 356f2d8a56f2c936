"""Learning checks for the algorithm library, each from the same SFT warm-up checkpoint.

- ``ppo`` (with critic) and ``rloo``: held-out greedy accuracy on the arithmetic test set.
- ``dpo``: on generated (correct, wrong) answer pairs, the chosen-over-rejected
  log-likelihood margin on held-out pairs.
- ``sft``: held-out negative log-likelihood of the answers.
- ``guess_number``: the multi-turn example (``examples/guess_number``), its own SFT warm-up
  then GRPO on whole episodes: success rate on held-out games (opening ranges never trained
  on), sampled at temperature 1; ``--plot`` draws its curve.

Usage::

    python bench/learning_checks.py --sft-checkpoint CKPT/hf --data ./quickstart --out out.json
    python bench/learning_checks.py --only guess_number --out docs/results/guess_number.json \
        --plot docs/results/guess_number.png

Writes one JSON file with every curve and prints one line per check. It measures;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import time
from typing import Any, Dict, List, Tuple

import torch

from trinity.common.config import FormatConfig
from trinity.common.experience import ExperienceBatch
from trinity.demo.guess_number import prepare_guess_number
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run
from trinity.trainer.policy_step import response_logprobs
from trinity.utils.synthetic import read_jsonl, write_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
GUESS_NUMBER = os.path.join(ROOT, "examples", "guess_number", "guess_number.yaml")
QUICKSTART_CHECKS = ("ppo", "rloo", "dpo", "sft")


def _rl_config() -> str:
    """The quickstart config without its stages: one RL stage we can retarget."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "rl_only.yaml")
    with open(path, "w") as f:
        f.write(text[: text.index("stages:")])
    return path


def rl_check(algorithm: str, ckpt: str, steps: int, extra: List[str]) -> Dict:
    overrides = [
        f"name={algorithm}",
        f"algorithm.algorithm_type={algorithm}",
        f"model.model_path={ckpt}",
        f"model.critic_model_path={ckpt}",
        f"buffer.total_steps={steps}",
        f"explorer.eval_interval={max(1, steps // 4)}",
        *extra,
    ]
    (result,) = run(_rl_config(), overrides, [])
    curve = [
        (r["step"], r["eval/arithmetic_test/accuracy/mean"])
        for r in read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
        if "eval/arithmetic_test/accuracy/mean" in r
    ]
    return {"heldout_accuracy": curve, "before": curve[0][1], "after": curve[-1][1]}


def _sequence_logprobs(model_path: str, rows: List[Dict]) -> torch.Tensor:
    """Sum of response-token logprobs of each (prompt, response) row under the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trinity.buffer import SFTFormatter

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    formatter = SFTFormatter(tokenizer, FormatConfig(prompt_key="prompt", response_key="response"))
    batch = ExperienceBatch.from_experiences(
        [formatter.format(r) for r in rows], tokenizer.pad_token_id
    )
    with torch.no_grad():
        logprob, _ = response_logprobs(model, batch, with_entropy=False)
    return (logprob * batch.action_mask).sum(-1)


def make_pairs(rows: List[Dict], seed: int) -> List[Dict]:
    """(question, correct answer, a nearby wrong answer) preference pairs."""
    rng = random.Random(seed)
    pairs = []
    for row in rows:
        wrong = int(row["answer"]) + rng.choice([-10, -1, 1, 10])
        pairs.append({"prompt": row["question"], "chosen": row["answer"], "rejected": str(wrong)})
    return pairs


def margin(model_path: str, pairs: List[Dict]) -> float:
    chosen = _sequence_logprobs(
        model_path, [{"prompt": p["prompt"], "response": p["chosen"]} for p in pairs]
    )
    rejected = _sequence_logprobs(
        model_path, [{"prompt": p["prompt"], "response": p["rejected"]} for p in pairs]
    )
    return float((chosen - rejected).mean())


def heldout_nll(model_path: str, rows: List[Dict]) -> float:
    data = [{"prompt": r["question"], "response": r["answer"]} for r in rows]
    return float(-_sequence_logprobs(model_path, data).mean())


def train_only(algorithm: str, ckpt: str, data_dir: str, fmt: str, steps: int) -> str:
    overrides = [
        f"name={algorithm}",
        "mode=train",
        f"algorithm.algorithm_type={algorithm}",
        "algorithm.optimizer.lr=1e-5" if algorithm == "dpo" else "algorithm.optimizer.lr=1e-4",
        f"model.model_path={ckpt}",
        "buffer.train_batch_size=64",
        f"buffer.total_steps={steps}",
        f"buffer.trainer_input.experience_buffer={{name: {algorithm}_data, storage_type: file,"
        f" path: {data_dir}, format: {fmt}}}",
    ]
    (result,) = run(_rl_config(), overrides, [])
    return result.final_hf


def curve(records: List[Dict[str, Any]], key: str) -> List[Tuple[int, float]]:
    """(step, value) of every record holding ``key``."""
    return [(r["step"], r[key]) for r in records if key in r]


def random_policy_success(rows: List[Dict[str, Any]]) -> float:
    """Expected success of uniform guesses inside the interval left, averaged over ``rows``."""

    @functools.cache
    def win(size: int, turns: int) -> float:
        # The secret is uniform among ``size`` numbers; a guess at position i leaves i below
        # and size - 1 - i above, each side reached with probability (its size) / size.
        if turns == 0:
            return 0.0
        total = sum(
            1 + i * win(i, turns - 1) + (size - 1 - i) * win(size - 1 - i, turns - 1)
            for i in range(size)
        )
        return total / (size * size)

    return sum(win(r["high"] - r["low"] + 1, r["max_turns"]) for r in rows) / len(rows)


def guess_number_check(args: argparse.Namespace) -> Dict[str, Any]:
    """Both stages of ``examples/guess_number`` on freshly prepared data; the held-out curve."""
    root = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "guess_number")
    paths = prepare_guess_number(os.path.join(root, "data"), preset=args.preset, n_sft=args.n_sft)
    os.environ["TRINITY_GUESS_NUMBER_DIR"] = os.path.join(root, "data")
    overrides = [
        f"checkpoint_root_dir={root}",
        f"stages.0.buffer.total_epochs={args.sft_epochs}",
        f"buffer.total_steps={args.steps}",
        f"explorer.eval_interval={max(1, args.steps // 4)}",
    ]
    start = time.monotonic()
    _, grpo = run(GUESS_NUMBER, overrides, [])
    explorer = read_metrics(os.path.join(grpo.job_dir, "monitor", "explorer.jsonl"))
    heldout = curve(explorer, "eval/guess_number_test/accuracy/mean")
    return {
        "metric": "success rate on held-out games (opening ranges never trained on), "
        "4 episodes each at temperature 1, after the SFT warm-up (step 0) and along GRPO",
        "before": heldout[0][1],
        "after": heldout[-1][1],
        "heldout_success": heldout,
        "heldout_turns": curve(explorer, "eval/guess_number_test/turns/mean"),
        "train_success": curve(explorer, "rollout/accuracy/mean"),
        "random_policy_success": random_policy_success(
            read_jsonl(os.path.join(paths["rl_path"], "test.jsonl"))
        ),
        "wall_seconds": round(time.monotonic() - start, 1),
        "settings": {"preset": args.preset, "n_sft": args.n_sft, "overrides": overrides},
    }


def plot_guess_number(result: Dict[str, Any], path: str) -> None:
    """The held-out and training success curves against GRPO step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (
        ("heldout_success", "held-out games (eval, T=1)", "o-"),
        ("train_success", "training rollouts (T=1)", "-"),
    ):
        steps, values = zip(*result[key], strict=True)
        ax.plot(steps, values, style, label=label, alpha=1.0 if "o" in style else 0.5)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="binary search")
    chance = result["random_policy_success"]
    ax.axhline(chance, color="grey", lw=0.8, ls="--", label="random guess in the interval")
    ax.set_xlabel("GRPO step (after the SFT warm-up)")
    ax.set_ylabel("success rate (secret found within max_turns)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Guess the number, {result['settings']['preset']} model on CPU")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-checkpoint", help="the quickstart SFT warm-up (quickstart checks)")
    parser.add_argument("--data", help="the quickstart folder (data/rl, data/sft)")
    parser.add_argument("--out", default="learning_checks.json")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--only", nargs="*", default=list(QUICKSTART_CHECKS))
    parser.add_argument("--plot", help="guess_number: PNG of its curves (needs matplotlib)")
    parser.add_argument("--preset", default="tiny", help="guess_number: the model's size")
    parser.add_argument("--n-sft", type=int, default=4000, help="guess_number: SFT dialogues")
    parser.add_argument("--sft-epochs", type=int, default=2, help="guess_number: SFT epochs")
    args = parser.parse_args()
    quickstart = [c for c in args.only if c in QUICKSTART_CHECKS]
    if quickstart and not (args.sft_checkpoint and args.data):
        parser.error(f"{', '.join(quickstart)} need --sft-checkpoint and --data")
    os.environ.setdefault("TRINITY_CHECKPOINT_ROOT_DIR", os.path.abspath("learning_checks_ckpt"))
    os.makedirs(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], exist_ok=True)
    results: Dict[str, Dict] = {}
    if "guess_number" in args.only:
        results["guess_number"] = guess_number_check(args)
        if args.plot:
            plot_guess_number(results["guess_number"], args.plot)
    if quickstart:
        results.update(quickstart_checks(args, quickstart))
    for check, result in results.items():
        print(f"{check}: {result['before']:.3f} -> {result['after']:.3f}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


def quickstart_checks(args: argparse.Namespace, checks: List[str]) -> Dict[str, Dict]:
    """ppo, rloo, dpo and sft from the quickstart's SFT warm-up."""
    os.environ["TRINITY_QUICKSTART_DIR"] = os.path.abspath(args.data)
    rl_dir = os.path.join(args.data, "data", "rl")
    train, test = (
        read_jsonl(os.path.join(rl_dir, "train.jsonl")),
        read_jsonl(os.path.join(rl_dir, "test.jsonl")),
    )
    results: Dict[str, Dict] = {}
    for algorithm in checks:
        if algorithm in ("ppo", "rloo"):
            extra = (
                ["algorithm.repeat_times=1", "buffer.batch_size=64"] if algorithm == "ppo" else []
            )
            results[algorithm] = rl_check(algorithm, args.sft_checkpoint, args.steps, extra)
        elif algorithm == "dpo":
            pair_dir = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "dpo_data")
            write_jsonl(os.path.join(pair_dir, "train.jsonl"), make_pairs(train, seed=0))
            heldout = make_pairs(test, seed=1)
            fmt = "{prompt_key: prompt, chosen_key: chosen, rejected_key: rejected}"
            final = train_only("dpo", args.sft_checkpoint, pair_dir, fmt, args.steps)
            results["dpo"] = {
                "before": margin(args.sft_checkpoint, heldout),
                "after": margin(final, heldout),
                "metric": "mean log p(chosen) - log p(rejected), held-out pairs",
            }
        elif algorithm == "sft":
            sft_dir = os.path.join(args.data, "data", "sft")
            fmt = "{prompt_key: prompt, response_key: response}"
            final = train_only("sft", args.sft_checkpoint, sft_dir, fmt, args.steps)
            results["sft"] = {
                "before": heldout_nll(args.sft_checkpoint, test),
                "after": heldout_nll(final, test),
                "metric": "held-out answer NLL (nats per answer)",
            }
    return results


if __name__ == "__main__":
    main()
