"""Learning checks for the algorithm library, each from the same SFT warm-up checkpoint.

- ``ppo`` (with critic) and ``rloo``: held-out greedy accuracy on the arithmetic test set.
- ``dpo``: on generated (correct, wrong) answer pairs, the chosen-over-rejected
  log-likelihood margin on held-out pairs.
- ``sft``: held-out negative log-likelihood of the answers.

Usage::

    python bench/learning_checks.py --sft-checkpoint CKPT/hf --data ./quickstart --out out.json

Writes one JSON file with every curve and prints one line per algorithm. It measures;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from typing import Dict, List

import torch

from trinity.common.config import FormatConfig
from trinity.common.experience import ExperienceBatch
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run
from trinity.trainer.policy_step import response_logprobs
from trinity.utils.synthetic import read_jsonl, write_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the quickstart folder (data/rl, data/sft)")
    parser.add_argument("--out", default="learning_checks.json")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--only", nargs="*", default=["ppo", "rloo", "dpo", "sft"])
    args = parser.parse_args()
    os.environ["TRINITY_QUICKSTART_DIR"] = os.path.abspath(args.data)
    os.environ.setdefault("TRINITY_CHECKPOINT_ROOT_DIR", os.path.abspath("learning_checks_ckpt"))
    os.makedirs(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], exist_ok=True)
    rl_dir = os.path.join(args.data, "data", "rl")
    train, test = (
        read_jsonl(os.path.join(rl_dir, "train.jsonl")),
        read_jsonl(os.path.join(rl_dir, "test.jsonl")),
    )
    results: Dict[str, Dict] = {}
    for algorithm in args.only:
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
        print(
            f"{algorithm}: {results[algorithm]['before']:.3f} -> {results[algorithm]['after']:.3f}"
        )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
