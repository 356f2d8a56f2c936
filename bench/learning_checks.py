"""Learning checks for the algorithm library, each from the same SFT warm-up checkpoint.

- the RL algorithms of ``RL_CHECKS`` (``ppo`` with its critic, ``grpo``, ``rloo``, ``topr``,
  ``asymre``, ``rec``, ``sppo``, ``sapo``, ``m2po``): held-out greedy accuracy on the
  arithmetic test set, each the quickstart's GRPO stage with only ``algorithm_type`` changed;
  ``--sync-interval 4`` trains them on data up to 3 updates stale (``<name>_sync4``).
- ``mix_chord``: CHORD from the untrained model, RL rows plus as many rows of the SFT data
  each step, against SFT-then-GRPO (the warm-up, then ``grpo``): held-out accuracy.
- ``on_policy_distill`` and ``jsd``: the warm-up distilled from ``--teacher`` (e.g. a
  ``grpo`` check's final weights) on its own samples, no reward: held-out accuracy.
- ``lora``: the same for GRPO training only a LoRA adapter (``LORA_OVERRIDES``; ``--lora-lr``).
- ``dpo``: on generated (correct, wrong) answer pairs, the chosen-over-rejected
  log-likelihood margin on held-out pairs.
- ``sft``: held-out negative log-likelihood of the answers.
- ``guess_number`` and ``calculator``: the multi-turn examples (``examples/guess_number``,
  ``examples/calculator_agent``), each with its own SFT warm-up then GRPO on whole episodes:
  success rate on held-out games / questions, sampled at temperature 1; ``--plot`` draws it.
  Without ``--preset``, ``--n-sft``, ``--sft-epochs``, ``--steps`` they run what the example
  ships (its ``prepare_*`` defaults and YAML). ``guess_number_gigpo`` is the same example
  with ``algorithm_type: gigpo``, trained from the SFT warm-up ``guess_number`` wrote (the
  finished SFT stage is not run again) when both run in one call.
- ``selectors``: task selectors compared by steps and seconds to a held-out accuracy target,
  GRPO from the quickstart's SFT warm-up with each (``bench/selector_check.py``).
- ``smollm2`` (and ``smollm2_lora``, ``smollm2_tinker``, ``smollm2_sft``, ``smollm2_dpo``):
  the real model of ``examples/smollm2`` (needs the ``smollm2`` extra), GRPO as shipped with
  held-out greedy accuracy (``smollm2_tinker``: ``grpo_tinker.yaml`` through this project's
  Tinker service, started here; needs the ``tinker`` extra); SFT on chat ``messages``,
  held-out answer NLL; DPO, held-out margin.

Usage::

    python bench/learning_checks.py --sft-checkpoint CKPT/hf --data ./quickstart --out out.json
    python bench/learning_checks.py --only guess_number --out docs/results/guess_number.json \
        --plot docs/results/guess_number.png
    python bench/learning_checks.py --only guess_number guess_number_gigpo --steps 40 \
        --out docs/results/guess_number_gigpo.json
    python bench/learning_checks.py --only smollm2 --out docs/results/smollm2.json \
        --plot docs/results/smollm2.png
    python bench/learning_checks.py --only selectors --sft-checkpoint CKPT/hf --data ./quickstart \
        --steps 40 --out docs/results/selectors.json

Writes one JSON file with every curve and prints one line per check. It measures;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any, Dict, List

import torch

from trinity.common.config import FormatConfig
from trinity.common.experience import ExperienceBatch
from trinity.demo.synthetic import read_jsonl, write_jsonl
from trinity.demo.word_problems import preference_pair, prepare_smollm2
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run
from trinity.trainer.policy_step import response_logprobs

try:  # imported from the repository root, or run as a script from bench/
    from bench.multi_turn_check import MULTI_TURN, curve, multi_turn_check, plot_multi_turn
    from bench.selector_check import SELECTORS, selector_checks
except ImportError:
    from multi_turn_check import MULTI_TURN, curve, multi_turn_check, plot_multi_turn
    from selector_check import SELECTORS, selector_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
RL_CHECKS = ("ppo", "grpo", "rloo", "topr", "asymre", "rec", "sppo", "sapo", "m2po")
DISTILL_CHECKS = ("on_policy_distill", "jsd")
QUICKSTART_CHECKS = (*RL_CHECKS, "mix_chord", *DISTILL_CHECKS, "dpo", "sft", "lora")
# CHORD-mu (arXiv:2508.11408): mostly SFT at first, mostly RL at the end; RL rows as GRPO's
# (train_batch_size = 2 x 128, half expert rows), so only the expert rows are added. One lr
# serves both terms: the warm-up's SFT lr (5e-4), decayed by a cosine to GRPO's 3e-5 (at the
# RL stage's 3e-5 throughout, 50 steps from the untrained model left accuracy at 0).
CHORD_OVERRIDES = [
    "buffer.train_batch_size=256",
    "algorithm.optimizer.lr=5e-4",
    "algorithm.optimizer.lr_scheduler_type=cosine",
    "algorithm.optimizer.min_lr_ratio=0.06",
    # CHORD-mu uses the plain SFT loss: phi = p (1 - p) is ~0 on an untrained model's tokens
    # (p ~ 1 / vocabulary), so CHORD-phi's weighting would keep the expert data from teaching
    "algorithm.policy_loss_fn_args={mu_peak: 0.9, mu_valley: 0.05, mu_decay_steps: %d, "
    "enable_phi_function: false}",
    "buffer.trainer_input.auxiliary_buffers={sft_dataset: {name: sft_dataset, storage_type: "
    "file, path: %s, format: {prompt_key: prompt, response_key: response}}}",
]
# GRPO with an adapter on every Linear layer; LoRA wants a higher lr than the full model's
# 3e-5 (the adapter starts at zero and holds few parameters): --lora-lr.
LORA_OVERRIDES = ["model.lora_configs=[{lora_rank: 16, lora_alpha: 32}]"]


def _rl_config() -> str:
    """The quickstart config without its stages: one RL stage we can retarget."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "rl_only.yaml")
    with open(path, "w") as f:
        f.write(text[: text.index("stages:")])
    return path


def rl_check(
    algorithm: str, ckpt: str, steps: int, extra: List[str], name: str = "", sync: int = 1
) -> Dict:
    """``steps`` of ``algorithm`` from ``ckpt``, evaluated about 4 times; ``sync``: the
    synchronizer's sync_interval (the explorer samples with weights up to ``sync - 1``
    updates old), each evaluation then falling on a sync."""
    interval = max(sync, steps // 4 // sync * sync)  # eval weights exist at syncs only
    overrides = [
        f"name={name or algorithm}",
        "continue_from_checkpoint=false",  # a fresh run (<name>_<time>), never an old one's end
        f"algorithm.algorithm_type={algorithm}",
        f"model.model_path={ckpt}",
        f"model.critic_model_path={ckpt}",
        f"buffer.total_steps={steps}",
        f"explorer.eval_interval={interval}",
        f"synchronizer.sync_interval={sync}",
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


def train_only(
    algorithm: str,
    ckpt: str,
    data_dir: str,
    fmt: str,
    steps: int,
    config: str = "",
    lr: float = 0.0,
    batch: int = 64,
) -> str:
    """Train ``ckpt`` with ``algorithm`` on the rows at ``data_dir``; the final HF folder.
    ``config`` (default: the quickstart's RL stage) supplies everything else."""
    overrides = [
        f"name={algorithm}",
        "mode=train",
        f"algorithm.algorithm_type={algorithm}",
        f"algorithm.optimizer.lr={lr or (1e-5 if algorithm == 'dpo' else 1e-4)}",
        f"model.model_path={ckpt}",
        f"buffer.train_batch_size={batch}",
        f"buffer.total_steps={steps}",
        f"buffer.trainer_input.experience_buffer={{name: {algorithm}_data, storage_type: file,"
        f" path: {data_dir}, format: {fmt}}}",
    ]
    (result,) = run(config or _rl_config(), overrides, [])
    return result.final_hf


SMOLLM2 = os.path.join(ROOT, "examples", "smollm2", "grpo.yaml")
SMOLLM2_TINKER = os.path.join(ROOT, "examples", "smollm2", "grpo_tinker.yaml")
SMOLLM2_CHECKS = ("smollm2", "smollm2_lora", "smollm2_tinker", "smollm2_sft", "smollm2_dpo")


def smollm2_checks(args: argparse.Namespace, checks: List[str]) -> Dict[str, Dict]:
    """The real model (examples/smollm2): GRPO as shipped (and with a LoRA adapter), held-out
    greedy accuracy; SFT on chat messages, held-out answer NLL; DPO, held-out margin."""
    root = os.path.join(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], "smollm2")
    paths = prepare_smollm2(root)
    os.environ["TRINITY_SMOLLM2_DIR"] = root
    test = read_jsonl(os.path.join(paths["rl_path"], "test.jsonl"))
    model, results = paths["model_path"], {}
    for check in checks:
        start = time.monotonic()
        if check == "smollm2_tinker":
            results[check] = smollm2_tinker(root, args)
        elif check in ("smollm2", "smollm2_lora"):
            lora = [*LORA_OVERRIDES, f"algorithm.optimizer.lr={args.lora_lr}"]
            results[check] = smollm2_grpo(root, args, lora if check == "smollm2_lora" else [])
        elif check == "smollm2_sft":
            final = train_only(
                "sft",
                model,
                paths["sft_path"],
                "{prompt_type: messages, messages_key: messages}",
                args.steps or 20,
                SMOLLM2,
                lr=1e-5,
                batch=32,
            )
            results[check] = {
                "before": heldout_nll(model, test),
                "after": heldout_nll(final, test),
                "metric": "held-out answer NLL (nats per answer), chat template applied",
            }
        elif check == "smollm2_dpo":  # held-out questions, paired as the training data is
            heldout = [preference_pair((r["question"], int(r["answer"]))) for r in test]
            fmt = "{prompt_key: prompt, chosen_key: chosen, rejected_key: rejected}"
            final = train_only(
                "dpo", model, paths["dpo_path"], fmt, args.steps or 20, SMOLLM2, lr=1e-5, batch=32
            )
            results[check] = {
                "before": margin(model, heldout),
                "after": margin(final, heldout),
                "metric": "mean log p(chosen) - log p(rejected), held-out pairs",
            }
        results[check]["wall_seconds"] = round(time.monotonic() - start, 1)
    return results


def smollm2_grpo(
    root: str, args: argparse.Namespace, extra: List[str], config: str = SMOLLM2, name: str = ""
) -> Dict[str, Any]:
    """examples/smollm2/grpo.yaml, or ``config`` (``--steps`` and ``--override`` change it);
    curves."""
    name = name or "word_problems_grpo" + ("_lora" if extra else "")
    overrides = [f"checkpoint_root_dir={root}", f"name={name}", *extra, *args.override]
    if args.steps:
        interval = max(1, args.steps // 4)
        overrides += [f"buffer.total_steps={args.steps}", f"explorer.eval_interval={interval}"]
    (result,) = run(config, overrides, [])
    explorer = read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
    heldout = curve(explorer, "eval/word_problems_test/accuracy/mean")
    return {
        "metric": "held-out accuracy, greedy (200 word problems no training question shares "
        "an operand pair with)",
        "before": heldout[0][1],
        "after": heldout[-1][1],
        "heldout_success": heldout,
        "train_success": curve(explorer, "rollout/accuracy/mean"),
        "settings": {"preset": "SmolLM2-135M-Instruct", "overrides": overrides},
    }


def smollm2_tinker(root: str, args: argparse.Namespace) -> Dict[str, Any]:
    """examples/smollm2/grpo_tinker.yaml against this project's Tinker service, started in
    this process on 127.0.0.1 (fp32, the CPU default); curves."""
    from trinity.tinker import ServeOptions, TinkerServer

    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    model = os.path.join(root, "model")
    state = os.path.join(root, "tinker-state")
    server = TinkerServer(ServeOptions(base_model=model, port=0, state_dir=state))
    os.environ["TINKER_BASE_URL"] = server.url
    try:
        return smollm2_grpo(root, args, [], SMOLLM2_TINKER, "word_problems_grpo_tinker")
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-checkpoint", help="the quickstart SFT warm-up (quickstart checks)")
    parser.add_argument("--data", help="the quickstart folder (data/rl, data/sft)")
    parser.add_argument("--out", default="learning_checks.json")
    parser.add_argument("--steps", type=int, help="RL steps (quickstart: 40; multi-turn: YAML's)")
    default = [c for c in QUICKSTART_CHECKS if c not in DISTILL_CHECKS]  # they need --teacher
    parser.add_argument("--only", nargs="*", default=default)
    parser.add_argument("--chord-steps", type=int, default=200, help="mix_chord: its steps")
    parser.add_argument("--teacher", help="on_policy_distill, jsd: the teacher's HF folder")
    parser.add_argument(
        "--sync-interval", type=int, default=1, help="RL checks: on stale data (e.g. m2po)"
    )
    # 2e-4: the best of 2e-4, 5e-4, 2e-3, 5e-3 (docs/results/lora.json); 2e-3 and up unlearn
    parser.add_argument("--lora-lr", type=float, default=2e-4, help="lora: the adapter's lr")
    parser.add_argument("--plot", help="multi-turn: PNG of its curves (needs matplotlib)")
    # Unset, the multi-turn checks run what each example ships: its prepare function's
    # preset and SFT dialogues, its YAML's SFT epochs.
    parser.add_argument("--preset", help="multi-turn: the model's size")
    parser.add_argument("--n-sft", type=int, help="multi-turn: SFT dialogues")
    parser.add_argument("--sft-epochs", type=int, help="multi-turn: SFT epochs")
    parser.add_argument(
        "--override", nargs="*", default=[], help="multi-turn and smollm2: config overrides"
    )
    parser.add_argument("--selectors", nargs="*", default=list(SELECTORS))
    parser.add_argument("--target-gain", type=float, default=0.15, help="selectors: over step 0")
    parser.add_argument("--eval-every", type=int, default=2, help="selectors: eval interval")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="selectors")
    parser.add_argument("--prior-samples", type=int, default=4, help="selectors: per task")
    args = parser.parse_args()
    unknown = [s for s in args.selectors if s not in SELECTORS]
    if unknown:
        parser.error(f"--selectors {unknown}: choose among {', '.join(SELECTORS)}")
    quickstart = [c for c in args.only if c in (*QUICKSTART_CHECKS, "selectors")]
    if quickstart and not (args.sft_checkpoint and args.data):
        parser.error(f"{', '.join(quickstart)} need --sft-checkpoint and --data")
    if set(args.only) & set(DISTILL_CHECKS) and not args.teacher:
        parser.error(f"{' and '.join(DISTILL_CHECKS)} need --teacher")
    # Read by every Ray worker's OpenMP at start: threads that spin while a peer waits for a
    # busy core made a micro SFT step ~10x slower on a shared 2-core machine (0.2 s vs 2+ s).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TRINITY_CHECKPOINT_ROOT_DIR", os.path.abspath("learning_checks_ckpt"))
    os.makedirs(os.environ["TRINITY_CHECKPOINT_ROOT_DIR"], exist_ok=True)
    results: Dict[str, Dict] = {}
    for name in [c for c in args.only if c in MULTI_TURN]:
        results[name] = multi_turn_check(name, args)
        if args.plot:
            plot_multi_turn(name, results[name], args.plot)
    smollm2 = [c for c in args.only if c in SMOLLM2_CHECKS]
    if smollm2:
        results.update(smollm2_checks(args, smollm2))
        if args.plot and "smollm2" in results:
            plot_multi_turn("smollm2", results["smollm2"], args.plot)
    if quickstart:
        results.update(quickstart_checks(args, quickstart))
    for check, result in results.items():
        if check == "selectors":
            for arm, r in result.items():
                if arm != "prior":
                    print(f"{arm}: steps to {r['target']:.3f}: {r['steps_to_target']}")
        else:
            print(f"{check}: {result['before']:.3f} -> {result['after']:.3f}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


def quickstart_checks(args: argparse.Namespace, checks: List[str]) -> Dict[str, Dict]:
    """The RL and distillation checks, dpo, sft, lora and selectors from the quickstart's SFT
    warm-up; mix_chord from the untrained model."""
    os.environ["TRINITY_QUICKSTART_DIR"] = os.path.abspath(args.data)
    rl_dir = os.path.join(args.data, "data", "rl")
    train, test = (
        read_jsonl(os.path.join(rl_dir, "train.jsonl")),
        read_jsonl(os.path.join(rl_dir, "test.jsonl")),
    )
    args.steps = args.steps or 40
    results: Dict[str, Dict] = {}
    for algorithm in checks:
        if algorithm in RL_CHECKS:
            extra = (
                ["algorithm.repeat_times=1", "buffer.batch_size=64"] if algorithm == "ppo" else []
            )
            key = algorithm if args.sync_interval == 1 else f"{algorithm}_sync{args.sync_interval}"
            results[key] = rl_check(
                algorithm, args.sft_checkpoint, args.steps, extra, key, args.sync_interval
            )
        elif algorithm in DISTILL_CHECKS:
            teacher = [f"explorer.auxiliary_models=[{{model_path: {args.teacher}}}]"]
            result = rl_check(algorithm, args.sft_checkpoint, args.steps, teacher)
            results[algorithm] = {**result, "teacher": args.teacher}
        elif algorithm == "mix_chord":
            steps = args.chord_steps
            sft_dir = os.path.abspath(os.path.join(args.data, "data", "sft"))
            *fixed, schedule, expert = CHORD_OVERRIDES
            extra = [*fixed, schedule % steps, expert % sft_dir]
            base = os.path.abspath(os.path.join(args.data, "model"))
            results["mix_chord"] = {
                **rl_check("mix_chord", base, steps, extra),
                "from": "the untrained model (no SFT warm-up)",
                "overrides": extra,
            }
        elif algorithm == "lora":
            extra = [*LORA_OVERRIDES, f"algorithm.optimizer.lr={args.lora_lr}"]
            result = rl_check("grpo", args.sft_checkpoint, args.steps, extra, name="lora")
            results["lora"] = {**result, "lr": args.lora_lr, "overrides": extra}
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
        elif algorithm == "selectors":
            results["selectors"] = selector_checks(
                _rl_config(), args.sft_checkpoint, args.data, args.steps, args
            )
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
