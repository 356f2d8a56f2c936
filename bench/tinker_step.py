"""Seconds of one GRPO train step through a Tinker service against the same step in-process.

Workload: one fixed GRPO batch of ``--groups`` x ``--repeat`` rows, ``--prompt-tokens`` +
``--response-tokens`` random token ids each, with rewards 0/1 alternating in each group (so
every group has an advantage signal) and rollout logprobs of about -10 (random tokens are
unlikely under any policy); the same experiences on every side. A step is
``Trainer.train_step``: advantages, the reference's logprobs where the KL loss reads them,
the update.

Sides (alternating, ``--repeats`` rounds, each timing ``--steps`` steps after a warm-up):

- ``local_lora``: the in-process trainer with ``model.lora_configs`` of ``--rank`` (the
  reference is the base with the adapter off);
- ``tinker_builtin``: ``model.tinker.enable`` against the project's own Tinker service,
  started in this process on 127.0.0.1 (``trinity/tinker``): ``kl_loss_fn: none``, so the
  update is the built-in ``ppo`` loss, one ``forward_backward`` and one ``optim_step``;
- ``tinker_custom``: the same with GRPO's ``k2`` KL loss: the reference's logprobs from the
  service (``compute_logprobs``) and ``forward_backward_custom`` (a forward, this
  project's loss here, a backward);
- ``local_lora_kl``: the in-process trainer with the same KL loss, to compare with it.

The service shares this machine's cores with the trainer, as a local service does; against
a remote service on GPUs the figures are its compute plus the network. It measures; it
asserts nothing. Writes a JSON record and prints one line per side.

Usage::

    python -m bench.tinker_step --model ./smollm2/model --out docs/results/tinker_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import textwrap
import time
from typing import Any, Dict, List

import torch

from trinity.common.config import load_config
from trinity.common.experience import Experience
from trinity.preflight.derive import finalize

CONFIG = """
project: bench
name: tinker_step_{side}
checkpoint_root_dir: {root}
mode: both
continue_from_checkpoint: false
cluster: {{gpu_per_node: 0}}
model:
  model_path: {model}
  max_prompt_tokens: {prompt}
  max_response_tokens: {response}
{model_extra}
algorithm:
  algorithm_type: grpo
  repeat_times: {repeat}
  kl_loss_fn: {kl}
  optimizer: {{lr: 1.0e-5}}
buffer:
  batch_size: {groups}
  explorer_input:
    taskset: {{name: t, path: /unused}}
trainer:
  trainer_config:
    actor_rollout_ref:
      actor: {{ppo_micro_batch_size_per_gpu: {rows}}}
"""

SIDES = {
    "local_lora": ("none", "  lora_configs: [{{lora_rank: {rank}, lora_alpha: {rank}}}]"),
    "tinker_builtin": ("none", "  tinker: {{enable: true, rank: {rank}, seed: 0}}"),
    "tinker_custom": ("k2", "  tinker: {{enable: true, rank: {rank}, seed: 0}}"),
    "local_lora_kl": ("k2", "  lora_configs: [{{lora_rank: {rank}, lora_alpha: {rank}}}]"),
}


def experiences(args: argparse.Namespace, vocab: int) -> List[Experience]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for group in range(args.groups):
        prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=generator)
        for sample in range(args.repeat):
            response = torch.randint(0, vocab, (args.response_tokens,), generator=generator)
            rows.append(
                Experience(
                    tokens=torch.cat([prompt, response]),
                    prompt_length=args.prompt_tokens,
                    logprobs=-10.0 - torch.rand(args.response_tokens, generator=generator),
                    reward=float(sample % 2),
                    group_id=str(group),
                )
            )
    return rows


def trainer(side: str, args: argparse.Namespace, root: str) -> Any:
    from trinity.trainer.tinker_client import TinkerTrainer
    from trinity.trainer.trainer import Trainer

    kl, extra = SIDES[side]
    text = CONFIG.format(
        side=side,
        root=root,
        model=args.model,
        prompt=args.prompt_tokens,
        response=args.response_tokens,
        model_extra=extra.format(rank=args.rank),
        repeat=args.repeat,
        kl=kl,
        groups=args.groups,
        rows=args.groups * args.repeat,
    )
    path = os.path.join(root, f"{side}.yaml")
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    config = finalize(load_config(path))
    cls = TinkerTrainer if config.model.tinker.enable else Trainer
    made = cls(config, planned_steps=10**6, log=lambda metrics, step: None)
    made.prepare_model()
    return made


def timed_steps(made: Any, rows: List[Experience], steps: int) -> List[float]:
    made.step += 1
    made.train_step(list(rows))  # warm-up: first calls, allocations
    seconds = []
    for _ in range(steps):
        made.step += 1
        start = time.monotonic()
        made.train_step(list(rows))
        seconds.append(time.monotonic() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local HF model folder")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--response-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from transformers import AutoConfig

    from trinity.tinker import ServeOptions, TinkerServer

    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    root = tempfile.mkdtemp(prefix="tinker-step-")
    server = TinkerServer(
        ServeOptions(base_model=args.model, port=0, state_dir=os.path.join(root, "state"))
    )
    os.environ["TINKER_BASE_URL"] = server.url
    rows = experiences(args, AutoConfig.from_pretrained(args.model).vocab_size)
    sides = args.sides.split(",")
    trainers = {side: trainer(side, args, root) for side in sides}
    seconds: Dict[str, List[float]] = {side: [] for side in sides}
    loads = []
    try:
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for side in sides:
                seconds[side] += timed_steps(trainers[side], rows, args.steps)
                print(f"{side:15s} {seconds[side]}", flush=True)
    finally:
        server.close()
    record = {
        "model": args.model,
        "rows": len(rows),
        "tokens_per_row": args.prompt_tokens + args.response_tokens,
        "lora_rank": args.rank,
        "cores": os.cpu_count(),
        "load_average_1m": loads,
        "seconds_per_step": seconds,
        "median_seconds": {side: statistics.median(s) for side, s in seconds.items()},
    }
    for side in sides:
        print(f"{side:15s} median {record['median_seconds'][side]:.2f} s/step  {seconds[side]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
