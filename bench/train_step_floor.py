"""The SmolLM2 GRPO stage's train step against its floor, and where the difference goes.

Workload: one GRPO step of ``examples/smollm2/grpo.yaml`` (8 word problems x 8 samples, up to
32 response tokens): real rollouts of SmolLM2-135M-Instruct, sampled once by the
transformers engine at the example's temperature and kept in ``--batch`` (a torch file) so
that every run measures the same rows; rewarded by the example's ``math_verify_reward``.

Sides, alternating in each of ``--repeats`` rounds after a warm-up of each:

- ``stage``: ``Trainer.train_step`` as the stage runs it (the example's config, with
  ``--dtype`` for the trainer's compute), each phase timed by wrapping the function the
  trainer calls: batching, advantages, the actor mask, the gradient accumulation (the
  passes), the gradient clip, the optimizer step, the metrics;
- ``stage_autocast`` (with ``--autocast-side`` and a bf16/fp16 ``--dtype``): the same stage on
  a second trainer whose passes cast every weight at each call under plain autocast, the
  compute-weight cache (``trinity/utils/compute_weights.py``) off: the cache's own effect,
  side by side with ``stage``;
- ``floor``: what the step cannot do without, measured alone on the same model and rows:
  the forward and backward of the policy's logprobs over the same micro-batches (the same
  scoring path, a plain policy-gradient loss), then the optimizer's step.

Writes a JSON record (medians and every round) and prints the table. It measures; it asserts
nothing.

Usage::

    python -m bench.train_step_floor --smollm2 ./smollm2 --out docs/results/train_step_floor.json
    python -m bench.train_step_floor --smollm2 ./smollm2 --dtype bf16 --autocast-side \
        --out docs/results/train_step_floor_bf16.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any, Dict, List

import torch

from trinity.common.config import load_config
from trinity.common.experience import Experience
from trinity.preflight.derive import finalize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "smollm2", "grpo.yaml")
PARAM_DTYPE = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.mixed_precision"


def sample_batch(smollm2: str, prompts: int, n: int, max_tokens: int) -> List[Experience]:
    """``prompts`` word problems x ``n`` replies from the engine, rewarded as the example is."""
    from trinity.common.models.sampling import SamplingParams
    from trinity.common.rewards.verified import MathVerifyReward
    from trinity.engine.hf_engine import TransformersEngine

    with open(os.path.join(smollm2, "data", "rl", "train.jsonl")) as f:
        rows = [json.loads(line) for line in itertools.islice(f, prompts)]
    engine = TransformersEngine(
        os.path.join(smollm2, "model"),
        seed=0,
        max_model_len=2048,
        max_prompt_tokens=96,
        max_response_tokens=max_tokens,
    )
    encoded = [
        engine.apply_chat_template([{"role": "user", "content": r["question"]}]) for r in rows
    ]
    params = [SamplingParams(n=n, temperature=0.8, max_tokens=max_tokens) for _ in rows]
    reward, out = MathVerifyReward(), []
    for group, (row, samples) in enumerate(
        zip(rows, engine.generate(encoded, params), strict=True)
    ):
        for sample in samples:
            text = engine.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            out.append(
                Experience(
                    tokens=sample.prompt_token_ids + sample.token_ids,
                    prompt_length=len(sample.prompt_token_ids),
                    logprobs=sample.logprobs,
                    reward=reward(text, str(row["answer"]))["accuracy"],
                    group_id=str(group),
                )
            )
    return out


def stage_trainer(smollm2: str, dtype: str, root: str) -> Any:
    from trinity.trainer.trainer import Trainer

    config = load_config(
        EXAMPLE,
        overrides=[f"checkpoint_root_dir={root}", f"{PARAM_DTYPE}.param_dtype={dtype}"],
    )
    trainer = Trainer(finalize(config), planned_steps=10**6, log=lambda metrics, step: None)
    trainer.prepare_model()
    return trainer


def timed(owner: Any, name: str, phases: Dict[str, float], label: str) -> None:
    """Replace ``owner.name`` by a wrapper that adds its seconds to ``phases[label]``."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            phases[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def instrument(trainer: Any) -> Dict[str, float]:
    """Phase seconds of ``trainer``'s steps from now on (``phases`` is reset by the caller)."""
    import trinity.trainer.trainer as module

    phases: Dict[str, float] = defaultdict(float)
    timed(trainer, "_batch", phases, "batch (pad, collate)")
    timed(trainer, "_prepare_batch", phases, "advantages")
    timed(module, "actor_batch", phases, "actor mask")
    timed(module, "accumulate_gradients", phases, "passes (forward + backward)")
    timed(torch.nn.utils, "clip_grad_norm_", phases, "gradient clip")
    timed(trainer.optimizer, "step", phases, "optimizer step")
    timed(trainer.optimizer, "zero_grad", phases, "zero grad")
    timed(module, "mismatch_metrics", phases, "metrics")
    timed(module, "batch_metrics", phases, "metrics")
    timed(module, "perf_metrics", phases, "metrics")
    return phases


def stage_round(trainer: Any, phases: Dict[str, float], rows: List[Experience]) -> Dict:
    """One ``train_step`` of ``trainer``: its seconds, each phase's, the load average."""
    load = os.getloadavg()[0]
    phases.clear()
    trainer.step += 1
    start = time.perf_counter()
    trainer.train_step(list(rows))
    return {"train step": time.perf_counter() - start, **phases, "load average": load}


def floor_step(trainer: Any, rows: List[Experience]) -> Dict[str, float]:
    """The passes and the optimizer step alone: (seconds of each)."""
    from trinity.trainer.policy_step import micro_batches, response_logprobs

    batch = trainer._batch(rows)
    advantages = torch.tensor([e.reward for e in rows]) - 0.5  # any signal: only time counts
    start = time.perf_counter()
    trainer.optimizer.zero_grad(set_to_none=True)
    size = trainer.settings["micro_batch_size_per_device"]
    max_tokens = trainer._tokens("max_token_len_per_device", "use_dynamic_bsz")
    tokens = batch.action_mask.sum()
    rows_at = 0
    for mb in micro_batches(batch, size, max_tokens):
        logprob, _ = response_logprobs(trainer.model, mb, trainer.fns.temperature, False)
        adv = advantages[rows_at : rows_at + len(mb)]
        rows_at += len(mb)
        (-(logprob * mb.action_mask * adv[:, None]).sum() / tokens).backward()
    passes = time.perf_counter() - start
    start = time.perf_counter()
    trainer.optimizer.step()
    return {"passes": passes, "optimizer step": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smollm2", required=True, help="prepare-quickstart --task smollm2's")
    parser.add_argument("--batch", default=None, help="rows sampled once (default: in --smollm2)")
    parser.add_argument("--dtype", default="fp32", help="the trainer's param_dtype")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--autocast-side",
        action="store_true",
        help="also time the stage under plain autocast (no compute-weight cache): stage_autocast",
    )
    parser.add_argument("--rows", type=int, default=None, help="only the first ROWS rows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = args.batch or os.path.join(args.smollm2, "floor_batch.pt")
    if not os.path.exists(path):
        torch.save(sample_batch(args.smollm2, 8, 8, 32), path)
    rows = torch.load(path, weights_only=False)[: args.rows]
    os.environ["TRINITY_SMOLLM2_DIR"] = args.smollm2
    trainer = stage_trainer(args.smollm2, args.dtype, tempfile.mkdtemp(prefix="floor-"))
    phases = instrument(trainer)
    side = None  # (trainer, phases) of stage_autocast: the same stage, the cache off
    if args.autocast_side:
        from trinity.utils.device import plain_autocast

        other = stage_trainer(args.smollm2, args.dtype, tempfile.mkdtemp(prefix="floor-"))
        plain_autocast(other.model)
        # Module-level wrappers now add to both sides' phases; each round clears its own
        # side's dict right before its step and copies it right after, so each keeps its own.
        side = (other, instrument(other))
    stage: List[Dict[str, float]] = []
    floor: List[Dict[str, float]] = []
    autocast: List[Dict[str, float]] = []
    for round_ in range(args.repeats + 1):  # round 0 warms every side up
        s_round = stage_round(trainer, phases, rows)
        a_round = stage_round(side[0], side[1], rows) if side else None
        floor_round = floor_step(trainer, rows)
        print(f"round {round_}: stage {s_round}\n         floor {floor_round}", flush=True)
        if a_round is not None:
            print(f"         stage_autocast {a_round}", flush=True)
        if round_:
            stage.append(s_round)
            floor.append(floor_round)
            if a_round is not None:
                autocast.append(a_round)
    record = summary(rows, args, stage, floor, autocast)
    print(json.dumps(record["medians"], indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)


def summary(
    rows: List[Experience],
    args: argparse.Namespace,
    stage: List[Dict],
    floor: List[Dict],
    autocast: List[Dict],
) -> Dict[str, Any]:
    def medians(rounds: List[Dict[str, float]]) -> Dict[str, float]:
        return {key: statistics.median(r.get(key, 0.0) for r in rounds) for key in rounds[0]}

    stage_m, floor_m = medians(stage), medians(floor)
    floor_total = floor_m["passes"] + floor_m["optimizer step"]
    side: Dict[str, Any] = {}
    if autocast:  # the cache's effect: plain autocast's step over the cached one's
        autocast_m = medians(autocast)
        side = {
            "stage_autocast": autocast_m,
            "autocast_over_cache": autocast_m["train step"] / stage_m["train step"],
        }
    return {
        "model": "SmolLM2-135M-Instruct",
        "dtype": args.dtype,
        "rows": len(rows),
        "response_tokens": sum(len(e.tokens) - e.prompt_length for e in rows),
        "prompt_tokens": [e.prompt_length for e in rows[:: len(rows) // 8]],
        "torch_threads": torch.get_num_threads(),
        "medians": {
            "stage": stage_m,
            "floor": {**floor_m, "total": floor_total},
            "ratio": stage_m["train step"] / floor_total,
            **side,
        },
        "rounds": {
            "stage": stage,
            "floor": floor,
            **({"stage_autocast": autocast} if autocast else {}),
        },
    }


if __name__ == "__main__":
    main()
